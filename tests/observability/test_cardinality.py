"""Bounded metrics cardinality (issue 18, item 6), through the push endpoint and the ``/metrics`` scrape.

Regression: 30 replica names took ``/metrics`` from 81 to 741 series, with no
cap on bots or replicas and no end for a replica that stopped pushing; the
admin's own series had the bots' names and labels (``sum(botmesh_messages_in_total)``
added the admin to its bots) and an uptime of whichever gunicorn worker answered.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from botmesh_admin import config
from botmesh_admin.errors import ValidationError
from botmesh_admin.observability import metrics
from botmesh_admin.observability.domain import MetricsLimitExceeded
from botmesh_admin.observability.stores.base import BotMetricsStore, PushLimits
from botmesh_admin.observability.stores.memory import MemoryCounterStore

from .conftest import TenantClient
from .test_domain import BOTMESH_JSON
from .test_prometheus import promtool_check
from .test_store_contract import bot_store, snap  # noqa: F401 (the parametrized store fixture)


def scrape(client) -> tuple[str, list]:  # type: ignore[no-untyped-def]
    response = client.get("/metrics")
    assert response.status_code == 200
    text = response.content.decode()
    return text, [s for family in text_string_to_metric_families(text) for s in family.samples]


def replicas_on_metrics(client, tenant: str) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    _, samples = scrape(client)
    return sorted(
        {
            (s.labels["bot"], s.labels["replica"])
            for s in samples
            if s.name == "botmesh_messages_in_total" and s.labels.get("tenant") == tenant
        }
    )


def test_a_replica_beyond_the_cap_is_422_naming_the_limit_and_nothing_is_written(
    tenant_client: TenantClient, settings
) -> None:  # type: ignore[no-untyped-def]
    settings.BOTMESH_METRICS_MAX_REPLICAS = 2
    settings.BOTMESH_METRICS_MAX_BOTS = 2
    for replica in ("pod-a", "pod-b"):
        assert tenant_client.push("tienda-bot", {"replica": replica, "messages": {"in": 1}}).status_code == 201
    refused = tenant_client.push("tienda-bot", {"replica": "pod-c", "messages": {"in": 1}})
    assert refused.status_code == 422
    body = refused.json()
    assert (body["error"], body["field"], body["limit"], body["max"]) == (
        "limit_exceeded",
        "replica",
        "BOTMESH_METRICS_MAX_REPLICAS",
        2,
    )
    assert "BOTMESH_METRICS_MAX_REPLICAS=2" in body["message"] and "300 s" in body["message"]
    # a live replica keeps pushing, a second bot has room, a third has not
    assert tenant_client.push("tienda-bot", {"replica": "pod-a", "messages": {"in": 2}}).status_code == 201
    assert tenant_client.push("help-bot", {"replica": "pod-a", "messages": {"in": 1}}).status_code == 201
    refused = tenant_client.push("third-bot", {"replica": "pod-a", "messages": {"in": 1}})
    assert (refused.status_code, refused.json()["field"], refused.json()["limit"]) == (
        422,
        "bot",
        "BOTMESH_METRICS_MAX_BOTS",
    )
    assert replicas_on_metrics(tenant_client.api, tenant_client.tenant) == [
        ("help-bot", "pod-a"),
        ("tienda-bot", "pod-a"),
        ("tienda-bot", "pod-b"),
    ]
    latest = tenant_client.api.get(f"/api/v1/tenants/{tenant_client.tenant}/bots/metrics").json()
    assert len(latest) == 3


def test_a_replica_that_stopped_pushing_leaves_metrics_and_frees_its_place(
    tenant_client: TenantClient, settings
) -> None:  # type: ignore[no-untyped-def]
    settings.BOTMESH_METRICS_MAX_REPLICAS = 2
    settings.BOTMESH_METRICS_REPLICA_TTL_S = 1
    for replica in ("pod-a", "pod-b"):
        assert tenant_client.push("tienda-bot", {"replica": replica, "messages": {"in": 1}}).status_code == 201
    assert replicas_on_metrics(tenant_client.api, tenant_client.tenant) == [
        ("tienda-bot", "pod-a"),
        ("tienda-bot", "pod-b"),
    ]
    time.sleep(1.1)
    assert tenant_client.push("tienda-bot", {"replica": "pod-a", "messages": {"in": 2}}).status_code == 201
    assert replicas_on_metrics(tenant_client.api, tenant_client.tenant) == [("tienda-bot", "pod-a")]
    # pod-b expired, so a new replica (a rolling deploy's new pod) takes its place
    assert tenant_client.push("tienda-bot", {"replica": "pod-c", "messages": {"in": 1}}).status_code == 201
    # its history is still there for the metrics page (24 h)
    history = tenant_client.api.get(
        f"/api/v1/tenants/{tenant_client.tenant}/bots/tienda-bot/metrics", {"replica": "pod-b"}
    )
    assert history.status_code == 200 and len(history.json()) == 1


def test_admin_series_are_apart_from_the_bots(tenant_client: TenantClient) -> None:
    tenant_client.push("tienda-bot", {**BOTMESH_JSON, "replica": "pod-a"})  # messages.in 120
    tenant_client.push("tienda-bot", {"replica": "pod-b", "messages": {"in": 7}})
    with metrics.use_counter_store(MemoryCounterStore()):
        metrics.count("messages.in", n=4)
        text, samples = scrape(tenant_client.api)
    ours = [s for s in samples if s.labels.get("tenant") == tenant_client.tenant or "tenant" not in s.labels]
    # sum(botmesh_messages_in_total): the bots only
    assert sum(s.value for s in ours if s.name == "botmesh_messages_in_total") == 127
    assert all("tenant" in s.labels for s in ours if s.name == "botmesh_messages_in_total")
    (admin,) = [s for s in samples if s.name == "botmesh_admin_messages_in_total"]
    assert (admin.labels, admin.value) == ({"service": "botmesh-admin"}, 4)
    assert text.count("# TYPE botmesh_admin_uptime_seconds gauge") == 1
    promtool_check(text)


def test_concurrent_new_replicas_never_overrun_the_cap(bot_store: BotMetricsStore, tenant_id: str) -> None:  # noqa: F811
    """Eight new replicas push at once for the last three places: exactly three get in."""
    limits = PushLimits(max_bots=5, max_replicas=4, live_ms=60_000)
    bot_store.push(tenant_id, bot="b", replica="r0", snapshot=snap(0), received_at_ms=1, limits=limits)
    outcomes: list[str] = []
    barrier = threading.Barrier(8)

    def push(n: int) -> None:
        barrier.wait()
        try:
            bot_store.push(tenant_id, bot="b", replica=f"r{n + 1}", snapshot=snap(n), received_at_ms=1, limits=limits)
            outcomes.append("in")
        except MetricsLimitExceeded:
            outcomes.append("refused")

    threads = [threading.Thread(target=push, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(outcomes) == ["in"] * 3 + ["refused"] * 5
    assert len(bot_store.latest(tenant_id, bot="b")) == 4


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("BOTMESH_METRICS_MAX_BOTS", "many"),
        ("BOTMESH_METRICS_MAX_BOTS", "0"),
        ("BOTMESH_METRICS_MAX_REPLICAS", "-1"),
        ("BOTMESH_METRICS_REPLICA_TTL_S", "5m"),
        ("BOTMESH_METRICS_REPLICA_TTL_S", "86401"),
    ],
)
def test_a_bad_limit_stops_the_start_with_one_line_naming_it(variable: str, value: str) -> None:
    with pytest.raises(config.ConfigError) as info:
        config.load({variable: value})
    assert str(info.value).startswith(f"{variable}: ") and "\n" not in str(info.value)
    assert isinstance(MetricsLimitExceeded("replica", "x", limit=variable, maximum=1), ValidationError)


# -- the admin's uptime under gunicorn ----------------------------------------------------


def _get(port: int, path: str) -> str:
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        connection.request("GET", path, headers={"Connection": "close"})
        response = connection.getresponse()
        body = response.read().decode()
        assert response.status == 200, (response.status, body[:300])
        return body
    finally:
        connection.close()


def _uptime(port: int) -> float:
    for family in text_string_to_metric_families(_get(port, "/metrics")):
        if family.name == "botmesh_admin_uptime_seconds":
            return float(family.samples[0].value)
    raise AssertionError("no botmesh_admin_uptime_seconds on /metrics")


def _workers(master: int) -> list[int]:
    children = Path(f"/proc/{master}/task/{master}/children")
    return [int(pid) for pid in children.read_text().split()] if children.exists() else []


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads gunicorn's workers from /proc")
@pytest.mark.django_db(transaction=True)  # no open transaction: the database copy needs none
def test_uptime_is_the_same_whichever_gunicorn_worker_answers(tmp_path: Path) -> None:
    """Two workers, one of them replaced mid-test: every scrape reports the admin's uptime, not a worker's."""
    import signal

    from tests.faults.servers import Processes, free_port, migrated_copy, project_env, python

    env = project_env(tmp_path)
    (tmp_path / "data").mkdir()
    migrated_copy(tmp_path / "data" / "db.sqlite3")
    with Processes(tmp_path) as procs:
        port = free_port()
        web = procs.start("web", [python(), "-m", "gunicorn", "botmesh_admin.wsgi", "-b", f"127.0.0.1:{port}",
                                  "-w", "2", "--log-level", "warning"], env)  # fmt: skip
        deadline = time.monotonic() + 60
        while len(_workers(web.pid)) < 2 or not _answers(port):
            assert web.poll() is None and time.monotonic() < deadline, procs.log("web")
            time.sleep(0.2)
        # A scrape under load can take over a second: each expected value is the interval
        # the request's own start and end allow, not a point (the test flaked at 1.8 s).
        sent = time.monotonic()
        first = _uptime(port)
        answered = time.monotonic()
        time.sleep(2.0)
        old = _workers(web.pid)
        os.kill(old[0], signal.SIGTERM)  # gunicorn starts a new worker in its place
        while not (len(now := _workers(web.pid)) == 2 and old[0] not in now):
            assert web.poll() is None and time.monotonic() < deadline, procs.log("web")
            time.sleep(0.1)
        while not _answers(port):
            time.sleep(0.1)
        for _ in range(12):  # new connections: both workers answer some
            before = time.monotonic()
            uptime = _uptime(port)
            after = time.monotonic()
            low, high = first + (before - answered), first + (after - sent)
            assert low - 0.05 <= uptime <= high + 0.05, (first, low, uptime, high)


def _answers(port: int) -> bool:
    try:
        _get(port, "/healthz")
        return True
    except (OSError, AssertionError):
        return False
