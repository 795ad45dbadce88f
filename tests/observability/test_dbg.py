from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from botmesh_admin.observability import tracing
from tests.observability.conftest import TenantClient
from django.conf import settings

def test_dbg(tenant_client: TenantClient):
    ex = InMemorySpanExporter()
    print(settings.MIDDLEWARE)
    with tracing.capture(ex):
        r = tenant_client.api.get(f"/api/v1/tenants/{tenant_client.tenant}/bots/metrics")
    print(r.status_code, [(s.name, s.instrumentation_scope.name, dict(s.attributes)) for s in ex.get_finished_spans()])
    assert 0
