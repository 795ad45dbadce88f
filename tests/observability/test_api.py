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
        f"/api/v1/tenants/{tenant_client.tenant}/bots/tienda-bot/metrics", {"replica": "pod-a"}
    ).json()
    assert [s["snapshot"]["messages"]["in"] for s in history] == [1, 2]


def test_a_bad_snapshot_is_422_naming_the_field(tenant_client: TenantClient) -> None:
    response = tenant_client.push("tienda-bot", {"replica": "pod-a", "messages": {"outFailed": -3}})
    assert response.status_code == 422
    assert response.json()["field"] == "snapshot.messages.out_failed"
    assert tenant_client.push("tienda-bot", {"messages": {}}).json()["field"] == "replica"
    assert tenant_client.push("tienda-bot", {"replica": "a" * 129}).json()["field"] == "replica"
    assert tenant_client.push("tienda-bot", {"replica": ""}).json()["field"] == "replica"
    assert tenant_client.push("b" * 64, {"replica": "a"}).json()["field"] == "bot"


def test_history_of_an_unknown_replica_is_404(tenant_client: TenantClient) -> None:
    response = tenant_client.api.get(
        f"/api/v1/tenants/{tenant_client.tenant}/bots/tienda-bot/metrics", {"replica": "ghost"}
    )
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
    assert (
        other.api.post(
            f"/api/v1/tenants/{tenant_client.tenant}/bots/tienda-bot/metrics",
            {"replica": "x"},
            content_type="application/json",
        ).status_code
        == 404
    )
    assert len(tenant_client.api.get(f"/api/v1/tenants/{tenant_client.tenant}/bots/metrics").json()) == 1


def test_push_without_a_token_is_401(tenant_client: TenantClient) -> None:
    from django.test import Client

    response = Client().post(
        f"/api/v1/tenants/{tenant_client.tenant}/bots/b/metrics", {"replica": "x"}, content_type="application/json"
    )
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
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    assert values[("botmesh_admin_messages_in_total", (("service", "botmesh-admin"),))] == 4
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


# A quote, a backslash, a newline, "/" and non-Latin text: what real bots name their flows and replicas.
NASTY_BOT = 'tienda "bot" \\ ventas/\nñ'
NASTY_REPLICA = 'pod "a" \\\nworker1@host-7'
NASTY_FLOW = 'say "hi" \\ now\n¿sí? 注文'


def scrape(client: object) -> tuple[str, dict]:
    response = client.get("/metrics")  # type: ignore[attr-defined]
    assert response.status_code == 200
    text = response.content.decode()
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    return text, values


def test_any_unicode_text_is_a_flow_bot_and_replica_label(tenant_client: TenantClient) -> None:
    """Regression for issue 15 item 7: a flow named with a quote, a backslash and a newline was a 422.

    The whole snapshot is kept, read back with the same ids, and ``/metrics``
    escapes them as text format 0.0.4 wants: prometheus_client's parser and
    promtool read back exactly the ids that were pushed.
    """
    from urllib.parse import quote

    body = {"replica": NASTY_REPLICA, "messages": {"in": 3}, "flows": {NASTY_FLOW: {"started": 2, "completed": 1}}}
    url = f"/api/v1/tenants/{tenant_client.tenant}/bots/{quote(NASTY_BOT, safe='')}/metrics"
    response = tenant_client.bot.post(url, body, content_type="application/json")
    assert response.status_code == 201, response.content
    assert (response.json()["bot"], response.json()["replica"]) == (NASTY_BOT, NASTY_REPLICA)
    assert list(response.json()["snapshot"]["flows"]) == [NASTY_FLOW]

    latest = tenant_client.api.get(f"/api/v1/tenants/{tenant_client.tenant}/bots/metrics").json()
    assert [(s["bot"], s["replica"]) for s in latest] == [(NASTY_BOT, NASTY_REPLICA)]
    history = tenant_client.api.get(url, {"replica": NASTY_REPLICA}).json()
    assert [s["snapshot"]["messages"]["in"] for s in history] == [3]

    text, values = scrape(tenant_client.api)
    labels = (("bot", NASTY_BOT), ("replica", NASTY_REPLICA), ("tenant", tenant_client.tenant))
    assert values[("botmesh_messages_in_total", labels)] == 3
    flow = tuple(sorted((*labels, ("flow", NASTY_FLOW))))
    assert values[("botmesh_flow_started_total", flow)] == 2
    assert 'flow="say \\"hi\\" \\\\ now\\n¿sí? 注文"' in text
    promtool_check(text)
    # the metrics page shows that bot and its replica (escaped as HTML)
    page = tenant_client.page.get(f"/t/{tenant_client.tenant}/metrics/", {"bot": NASTY_BOT})
    assert page.status_code == 200
    assert [s.replica for s in page.context["replicas"]] == [NASTY_REPLICA]
    assert "tienda &quot;bot&quot;" in page.content.decode()


def test_the_longest_ids_in_any_script_round_trip(tenant_client: TenantClient) -> None:
    """63 and 128 four-byte characters: more than a Kv key holds as such, still one replica each."""
    bot, replica = "🤖" * 63, "𝓻" * 127
    for n, name in enumerate((replica + "1", replica + "2"), start=1):
        response = tenant_client.push(bot, {"replica": name, "messages": {"in": n}})
        assert response.status_code == 201, response.content
    assert tenant_client.push(bot, {"replica": replica + "1", "messages": {"in": 5}}).json()["seq"] == 2
    latest = tenant_client.api.get(f"/api/v1/tenants/{tenant_client.tenant}/bots/metrics").json()
    assert [(s["bot"], s["replica"], s["snapshot"]["messages"]["in"]) for s in latest] == [
        (bot, replica + "1", 5),
        (bot, replica + "2", 2),
    ]
    _, values = scrape(tenant_client.api)
    assert (
        values[
            ("botmesh_messages_in_total", (("bot", bot), ("replica", replica + "2"), ("tenant", tenant_client.tenant)))
        ]
        == 2
    )


def test_a_lone_surrogate_is_422_naming_the_field(tenant_client: TenantClient) -> None:
    raw = '{"replica": "pod-a", "flows": {"ok\\ud800": {"started": 1}}}'
    response = tenant_client.bot.post(
        f"/api/v1/tenants/{tenant_client.tenant}/bots/b/metrics", raw, content_type="application/json"
    )
    assert response.status_code == 422, response.content
    assert response.json()["field"].startswith("snapshot.flows.")
    raw = '{"replica": "pod-\\udc00", "messages": {"in": 1}}'
    response = tenant_client.bot.post(
        f"/api/v1/tenants/{tenant_client.tenant}/bots/b/metrics", raw, content_type="application/json"
    )
    assert (response.status_code, response.json()["field"]) == (422, "replica")
    assert tenant_client.api.get(f"/api/v1/tenants/{tenant_client.tenant}/bots/metrics").json() == []


def test_a_tenant_with_an_id_reserved_since_does_not_stop_the_loops_over_every_tenant(
    tenant_client: TenantClient,
) -> None:
    """An earlier version could create tenant ``system``, whose tables can no longer be named:
    /metrics answered 503, inbox.tick stopped at it and botmesh_reindex could not start."""
    from botmesh_admin.dashboard.management.commands.botmesh_reindex import (
        tenant_ids as reindex_ids,
    )
    from botmesh_admin.tenancy.models import Tenant
    from botmesh_admin.tenancy.selectors import tenant_ids
    from inbox.services import inbox_tick

    Tenant.objects.create(id="system", name="made before the id was reserved")
    tenant_client.push("tienda-bot", {**BOTMESH_JSON, "replica": "pod-a"})
    assert "system" not in tenant_ids() and tenant_client.tenant in tenant_ids()
    assert "system" not in reindex_ids(None)
    assert inbox_tick()["skipped"] == 0
    response = tenant_client.api.get("/metrics")
    assert response.status_code == 200
    assert f'tenant="{tenant_client.tenant}"' in response.content.decode()
