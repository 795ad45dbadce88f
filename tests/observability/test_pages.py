"""The metrics and traces pages: readable without JavaScript, tenant-isolated."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.test import Client

from botmesh_admin.kv.validation import now_ms
from botmesh_admin.observability import services, tracing

from .conftest import TenantClient, make_tenant
from .test_store_contract import span as span_dict
from .test_store_contract import tid


def push_series(tenant: str) -> None:
    start = now_ms() - 10 * 60_000
    for i in range(5):
        for replica, factor in (("pod-a", 1), ("pod-b", 2)):
            services.bot_metrics_push(
                tenant,
                bot="tienda-bot",
                replica=replica,
                received_at_ms=start + i * 60_000,
                snapshot={
                    "uptimeMs": 1000 * i,
                    "messages": {"in": 10 * i * factor, "out": 8 * i, "outFailed": i},
                    "conversations": {"started": i, "active": 1},
                    "errors": i,
                },
            )


def test_metrics_page_shows_latest_per_replica_and_chart_data(tenant_client: TenantClient) -> None:
    push_series(tenant_client.tenant)
    response = tenant_client.page.get(f"/t/{tenant_client.tenant}/metrics/")
    assert response.status_code == 200
    html = response.content.decode()
    assert 'data-replica="pod-a"' in html and 'data-replica="pod-b"' in html
    assert "<td>80</td>" in html  # pod-b messages in: 10 * 4 * 2
    series = response.context["series"]
    points = series["replicas"]["pod-b"]
    assert [p["messages_in"] for p in points] == [0, 20, 40, 60, 80]
    assert points[0]["messages_in_per_min"] is None and points[1]["messages_in_per_min"] == 20.0
    assert 'id="observability-series"' in html and "chart-4.6.1.umd.min.js" in html


def test_metrics_page_without_pushes_explains_how_to_push(tenant_client: TenantClient) -> None:
    html = tenant_client.page.get(f"/t/{tenant_client.tenant}/metrics/").content.decode()
    assert "No bot has pushed metrics" in html and f"/api/v1/tenants/{tenant_client.tenant}/bots/" in html


def test_rates_restart_from_zero_when_a_replica_restarts(tenant_client: TenantClient) -> None:
    from botmesh_admin.observability import selectors

    t0 = now_ms() - 5 * 60_000
    for i, value in enumerate((100, 160, 30)):
        services.bot_metrics_push(
            tenant_client.tenant,
            bot="b",
            replica="r",
            received_at_ms=t0 + i * 60_000,
            snapshot={"messages": {"in": value}},
        )
    points = selectors.bot_metrics_series(tenant_client.tenant, bot="b")["replicas"]["r"]
    assert [p["messages_in_per_min"] for p in points] == [None, 60.0, 30.0]


def test_pages_of_another_tenant_are_404(tenant_client: TenantClient) -> None:
    other = make_tenant()
    for path in ("metrics/", "traces/", f"traces/{tid(1)}/"):
        assert other.page.get(f"/t/{tenant_client.tenant}/{path}").status_code == 404


def test_nav_links_to_metrics_and_traces(tenant_client: TenantClient) -> None:
    html = tenant_client.page.get(f"/t/{tenant_client.tenant}/traces/").content.decode()
    assert f'href="/t/{tenant_client.tenant}/metrics/"' in html and f'href="/t/{tenant_client.tenant}/traces/"' in html


def test_traces_page_lists_filters_and_links_to_the_span_tree(tenant_client: TenantClient) -> None:
    tenant = tenant_client.tenant
    services.trace_record(
        tenant,
        [
            span_dict(tid(7), "a" * 16, None, "POST api/webhooks/whatsapp", now_ms() - 50.0, 40.0),
            span_dict(
                tid(7),
                "b" * 16,
                "a" * 16,
                "message.receive",
                now_ms() - 45.0,
                5.0,
                **{"botmesh.conversation_id": "conv-42"},
            ),
            span_dict(tid(7), "c" * 16, "b" * 16, "message.send", now_ms() - 30.0, 20.0),
        ],
    )
    services.trace_record(tenant, [span_dict(tid(8), "a" * 16, None, "GET api/whoami", now_ms() - 10.0, 3.0)])
    html = tenant_client.page.get(f"/t/{tenant}/traces/").content.decode()
    assert f'data-trace="{tid(7)}"' in html and f'data-trace="{tid(8)}"' in html
    only_conv = tenant_client.page.get(f"/t/{tenant}/traces/", {"conversation": "conv-42"}).content.decode()
    assert f'data-trace="{tid(7)}"' in only_conv and f'data-trace="{tid(8)}"' not in only_conv
    only_http = tenant_client.page.get(
        f"/t/{tenant}/traces/", {"kind": "http"}, HTTP_HX_REQUEST="true"
    ).content.decode()
    assert "<html" not in only_http and f'data-trace="{tid(7)}"' not in only_http
    tree = tenant_client.page.get(f"/t/{tenant}/traces/{tid(7)}/")
    assert tree.status_code == 200
    rows = [(r["depth"], r["span"]["name"]) for r in tree.context["rows"]]
    assert rows == [(0, "POST api/webhooks/whatsapp"), (1, "message.receive"), (2, "message.send")]
    assert 'data-depth="2"' in tree.content.decode()


def test_unknown_trace_is_404_and_a_bad_kind_is_400(tenant_client: TenantClient) -> None:
    assert tenant_client.page.get(f"/t/{tenant_client.tenant}/traces/{tid(99)}/").status_code == 404
    assert tenant_client.page.get(f"/t/{tenant_client.tenant}/traces/not-hex/").status_code == 404
    assert tenant_client.page.get(f"/t/{tenant_client.tenant}/traces/", {"kind": "bogus"}).status_code == 400


def test_system_traces_are_for_superusers_only(tenant_client: TenantClient, admin_client: TenantClient) -> None:
    """Traces of no tenant hold other tenants' failed requests: a tenant's admin must not see them.

    Regression: found by exploratory testing (any tenant admin could list and open them).
    """
    services.trace_record(
        None, [span_dict(tid(5), "a" * 16, None, "GET api/v1/tenants/other/ledger", now_ms() - 5.0, 1.0)]
    )
    for member in (tenant_client, admin_client):
        listed = member.page.get(f"/t/{member.tenant}/traces/", {"scope": "system"})
        opened = member.page.get(f"/t/{member.tenant}/traces/{tid(5)}/", {"scope": "system"})
        assert (listed.status_code, opened.status_code) == (404, 404)
        assert tid(5) not in listed.content.decode() + opened.content.decode()
        assert "no tenant (system)" not in member.page.get(f"/t/{member.tenant}/traces/").content.decode()
    superuser = get_user_model().objects.create_superuser(
        username=f"root-{admin_client.tenant}", password="pw-12345678"
    )
    page = Client()
    page.force_login(superuser)
    html = page.get(f"/t/{admin_client.tenant}/traces/", {"scope": "system"}).content.decode()
    assert f'data-trace="{tid(5)}"' in html
    assert page.get(f"/t/{admin_client.tenant}/traces/{tid(5)}/", {"scope": "system"}).status_code == 200


def test_a_page_view_is_itself_traced_for_the_tenant(tenant_client: TenantClient) -> None:
    tenant_client.page.get(f"/t/{tenant_client.tenant}/metrics/")
    tracing.force_flush()
    items = tenant_client.page.get(f"/t/{tenant_client.tenant}/traces/", {"kind": "http"}).context["items"]
    assert "GET /t/{tenant}/metrics/" in [i.name for i in items]
