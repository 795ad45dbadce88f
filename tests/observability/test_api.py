"""Bots push snapshots through the API; ``/metrics`` serves them with this process's own."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from botmesh_admin.observability import metrics
from botmesh_admin.observability.stores.memory import MemoryCounterStore

from .conftest import TenantClient, make_tenant
from .test_domain import BOTMESH_JSON
from .test_prometheus import promtool_check


def test_push_accepts_botmesh_camel_case_and_returns_the_stored_sample(tenant_client: TenantClient) -> None:
    response = tenant_client.push("tienda-bot", {**BOTMESH_JSON, "replica": "pod-a"})
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["bot"], body["replica"], body["seq"]) == ("tienda-bot", "pod-a", 1)
    assert body["snapshot"]["messages"] == {"in": 120, "out": 100, "out_failed": 2}
    assert body["snapshot"]["uptime"] == "3d 4h"
    assert body["received_at"].endswith("Z")


def test_replica_may_be_given_as_replica_id(tenant_client: TenantClient) -> None:
    response = tenant_client.push("tienda-bot", {"replicaId": "pod-b", "messages": {"in": 1}})
    assert response.status_code == 201 and response.json()["replica"] == "pod-b"


def test_latest_and_history_read_back(tenant_client: TenantClient) -> None:
    for n, replica in ((1, "pod-a"), (2, "pod-a"), (5, "pod-b")):
        assert tenant_client.push("tienda-bot", {"replica": replica, "messages": {"in": n}}).status_code == 201
    latest = tenant_client.api.get(f"/api/v1/tenants/{tenant_client.tenant}/bots/metrics").json()
    assert [(s["replica"], s["snapshot"]["messages"]["in"]) for s in latest] == [("pod-a", 2), ("pod-b", 5)]
    history = tenant_client.api.get(
        f"/api/v1/tenants/{tenant_client.tenant}/bots/tienda-bot/metrics", {"replica": "pod-a"}).json()
    assert [s["snapshot"]["messages"]["in"] for s in history] == [1, 2]


def test_a_bad_snapshot_is_422_naming_the_field(tenant_client: TenantClient) -> None:
    response = tenant_client.push("tienda-bot", {"replica": "pod-a", "messages": {"outFailed": -3}})
    assert response.status_code == 422
    assert response.json()["field"] == "snapshot.messages.out_failed"
    assert tenant_client.push("tienda-bot", {"messages": {}}).json()["field"] == "replica"
    assert tenant_client.push("Tienda Bot", {"replica": "a"}).json()["field"] == "bot"
    assert tenant_client.push("tienda-bot", {"replica": "a/b"}).json()["field"] == "replica"


def test_history_of_an_unknown_replica_is_404(tenant_client: TenantClient) -> None:
    response = tenant_client.api.get(
        f"/api/v1/tenants/{tenant_client.tenant}/bots/tienda-bot/metrics", {"replica": "ghost"})
    assert response.status_code == 404


def test_another_tenants_token_gets_404_and_sees_nothing(tenant_client: TenantClient) -> None:
    other = make_tenant()
    tenant_client.push("tienda-bot", {"replica": "pod-a", "messages": {"in": 1}})
    response = other.api.get(f"/api/v1/tenants/{tenant_client.tenant}/bots/metrics")
    assert response.status_code == 404
    response = other.push("tienda-bot", {"replica": "x", "messages": {"in": 1}})
    assert response.status_code == 201
    empty = other.push("tienda-bot", {"replica": "x", "mesages": {"in": 1}})  # a typo: nothing known in it
    assert (empty.status_code, empty.json()["field"]) == (422, "snapshot")
    assert other.api.post(f"/api/v1/tenants/{tenant_client.tenant}/bots/tienda-bot/metrics", {"replica": "x"},
                          content_type="application/json").status_code == 404
    assert len(tenant_client.api.get(f"/api/v1/tenants/{tenant_client.tenant}/bots/metrics").json()) == 1


def test_push_without_a_token_is_401(tenant_client: TenantClient) -> None:
    from django.test import Client

    response = Client().post(f"/api/v1/tenants/{tenant_client.tenant}/bots/b/metrics", {"replica": "x"},
                             content_type="application/json")
    assert response.status_code == 401


def test_metrics_endpoint_serves_process_and_pushed_series(tenant_client: TenantClient) -> None:
    tenant_client.push("tienda-bot", {**BOTMESH_JSON, "replica": "pod-a"})
    tenant_client.push("tienda-bot", {**BOTMESH_JSON, "replica": "pod-b", "messages": {"in": 7}})
    with metrics.use_counter_store(MemoryCounterStore()):
        metrics.count("messages.in", n=4)
        response = tenant_client.api.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    text = response.content.decode()
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text) for s in fam.samples
    }
    assert values[("botmesh_messages_in_total", ())] == 4
    key = (("bot", "tienda-bot"), ("replica", "pod-b"), ("tenant", tenant_client.tenant))
    assert values[("botmesh_messages_in_total", key)] == 7
    assert text.count("# TYPE botmesh_messages_in_total counter") == 1
    promtool_check(text)


def test_metrics_endpoint_requires_the_scrape_token_when_configured(tenant_client: TenantClient, settings) -> None:  # type: ignore[no-untyped-def]
    from django.test import Client

    settings.BOTMESH_METRICS_TOKEN = "scrape-secret"
    assert Client().get("/metrics").status_code == 401
    assert Client(HTTP_AUTHORIZATION="Bearer scrape-secret").get("/metrics").status_code == 200


def test_push_endpoint_is_in_the_openapi_document(tenant_client: TenantClient) -> None:
    schema = tenant_client.api.get("/api/v1/openapi.json").json()
    assert "/api/v1/tenants/{tenant}/bots/{bot}/metrics" in schema["paths"]
    assert "/api/v1/tenants/{tenant}/traces/{trace_id}" in schema["paths"]


def test_push_with_a_time_outside_the_retention_is_422(tenant_client: TenantClient) -> None:
    response = tenant_client.push("tienda-bot", {"replica": "pod-a", "at": 1_000})
    assert response.status_code == 422 and response.json()["field"] == "at"
