"""Celery routing: live messages (inbound webhooks, replies) have a queue of their own, bulk work another.

The tasks are queued by the same calls the services make. What each publish
carried (exchange and routing key, as the broker receives them) is recorded by
Celery's ``after_task_publish`` signal and mapped to the queue it reaches: the
queue named by the key on the default exchange, else the queue bound to that
exchange and key (the second test pins those bindings). The services' tasks are
``shared_task``s, which publish through the process's *current* Celery app: a
test that made another app current (``Celery()`` without ``set_as_current=False``)
once sent every task of this test to ``celery`` unrouted, so the fixture makes
the project's app current and says which app it found.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import current_app
from celery.signals import after_task_publish

from botmesh_admin.celery import app
from tests.polling import wait_until

QUEUES = ("celery", "live", "bulk")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def published() -> Iterator[dict[str, list[tuple[str, Any]]]]:
    """``{queue: [(task name, channel or first argument)]}`` of every task published while the test runs."""
    bound = {(q.exchange.name, q.routing_key): name for name, q in app.amqp.queues.items()}
    out: dict[str, list[tuple[str, Any]]] = {name: [] for name in QUEUES}

    def record(sender: str, body: Any, exchange: str, routing_key: str, headers: dict[str, Any], **_: Any) -> None:
        args, kwargs, _embed = body
        # The default exchange ("") delivers to the queue named by the routing key (AMQP 0-9-1 §3.1.3.1).
        queue = routing_key if exchange == "" else bound[(exchange, routing_key)]
        out[queue].append((headers["task"], kwargs.get("channel", args[0] if args else None)))

    previous = current_app._get_current_object()
    if previous is not app:
        warnings.warn(f"an earlier test left Celery app {previous.main!r} current", stacklevel=1)
        app.set_current()
    eager, app.conf.task_always_eager = app.conf.task_always_eager, False  # queued, not run here
    after_task_publish.connect(record, weak=False)
    try:
        yield out
    finally:
        after_task_publish.disconnect(record)
        app.conf.task_always_eager = eager
        previous.set_current()
        with app.connection_for_write() as conn:  # leave nothing behind for later tests of the process
            for name in QUEUES:
                conn.default_channel.queue_purge(name)


def test_inbound_and_reply_drains_go_to_live_bulk_work_to_bulk_the_rest_to_celery(
    published: dict[str, list[tuple[str, Any]]],
) -> None:
    if not app.conf.broker_url.startswith("memory://"):
        pytest.skip("needs the tests' in-memory broker")
    from botmesh_admin.events.tasks import drain, prune
    from campaigns.tasks import campaign_start_due
    from crm.tasks import segment_membership_build

    drain.delay("inbound")  # what event_publish and the webhook's journal append queue
    drain.delay(channel="outbox")  # an agent's or a bot's reply
    drain.delay("ledger")  # a bot's ledger push
    drain.delay(channel="crm-import")  # a CSV import
    drain.delay("campaigns-run")  # a campaign run
    drain.delay(None)
    drain.delay("demo")
    segment_membership_build.delay("t")
    campaign_start_due.delay("t", "c")
    prune.delay()

    assert published["live"] == [("events.drain", "inbound"), ("events.drain", "outbox")]
    assert published["bulk"] == [
        ("events.drain", "ledger"),
        ("events.drain", "crm-import"),
        ("events.drain", "campaigns-run"),
        ("crm.segment_membership_build", "t"),
        ("campaigns.start_due", "t"),
    ]
    assert published["celery"] == [("events.drain", None), ("events.drain", "demo"), ("events.prune", None)]


def test_a_worker_started_without_q_consumes_every_queue() -> None:
    assert set(app.amqp.queues) == set(QUEUES)
    # Each queue its own binding: a message routed to one queue reaches only that one.
    assert {name: (q.exchange.name, q.routing_key) for name, q in app.amqp.queues.items()} == {
        name: (name, name) for name in QUEUES
    }
    assert app.conf.task_default_queue == "celery"


def _niceness(pid: int) -> int:
    """The niceness of process ``pid`` (``/proc/<pid>/stat`` field 19, proc(5))."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[16])


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


@pytest.mark.parametrize(
    ("queues", "setting", "raised"),
    [("celery,bulk", None, 10), ("live", None, 0), ("celery,bulk", "0", 0), ("celery,bulk", "3", 3)],
    ids=["bulk-worker", "live-worker", "bulk-worker-nice-0", "bulk-worker-nice-3"],
)
def test_a_worker_without_live_work_runs_its_pool_at_a_lower_cpu_priority(
    tmp_path: Path, queues: str, setting: str | None, raised: int
) -> None:
    """A real worker (prefork, one child) on the embedded broker: its process and pool child are niced or not."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("BOTMESH_", "CELERY_", "DATABASE_URL", "REDIS_URL"))
    }
    env.update({"DJANGO_SETTINGS_MODULE": "botmesh_admin.settings", "BOTMESH_DATA_DIR": str(tmp_path)})
    if setting is not None:
        env["BOTMESH_BULK_WORKER_NICE"] = setting
    log = tmp_path / "worker.log"
    base = os.nice(0)
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "botmesh_admin", "worker", "-P", "prefork", "-c", "1",
             "-Q", queues, "-n", f"nice-{uuid.uuid4().hex[:6]}@%h", "-l", "INFO",
             "--without-heartbeat", "--without-gossip", "--without-mingle"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:

        def ready() -> bool:
            assert worker.poll() is None, log.read_text()
            return "ready." in log.read_text() and bool(_children(worker.pid))

        wait_until(ready, "the worker and its pool child", timeout_s=90)
        expected = min(19, base + raised)
        assert _niceness(worker.pid) == expected, log.read_text()
        assert [_niceness(child) for child in _children(worker.pid)] == [expected]
        lowered = "its CPU priority is lowered" in log.read_text()
        assert lowered == bool(raised)
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
