"""Celery routing: live messages (inbound webhooks, replies) have a queue of their own, bulk work another.

The tasks are queued by the same calls the services make, onto the tests'
in-memory broker (``memory://``), and read back from each queue there.
"""

from __future__ import annotations

from typing import Any

import pytest
from kombu import Connection

from botmesh_admin.celery import app

QUEUES = ("celery", "live", "bulk")


def _take_all(conn: Connection) -> dict[str, list[tuple[str, Any]]]:
    """Return ``{queue: [(task name, channel or args)]}`` of what waits in each queue, removing it."""
    out: dict[str, list[tuple[str, Any]]] = {}
    for name in QUEUES:
        queue = conn.SimpleQueue(name, no_ack=True)
        got = []
        while True:
            try:
                message = queue.get(block=False)
            except queue.Empty:
                break
            args, kwargs, _ = message.decode()
            got.append((message.headers["task"], kwargs.get("channel", args[0] if args else None)))
        queue.close()
        out[name] = got
    return out


@pytest.fixture
def broker():
    if not app.conf.broker_url.startswith("memory://"):
        pytest.skip("needs the tests' in-memory broker")
    eager, app.conf.task_always_eager = app.conf.task_always_eager, False  # queued, not run here
    try:
        with app.connection_for_write() as conn:
            _take_all(conn)  # what earlier tests of this process left
            yield conn
    finally:
        app.conf.task_always_eager = eager


def test_inbound_and_reply_drains_go_to_live_bulk_work_to_bulk_the_rest_to_celery(broker: Connection) -> None:
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

    queued = _take_all(broker)
    assert queued["live"] == [("events.drain", "inbound"), ("events.drain", "outbox")]
    assert queued["bulk"] == [
        ("events.drain", "ledger"),
        ("events.drain", "crm-import"),
        ("events.drain", "campaigns-run"),
        ("crm.segment_membership_build", "t"),
        ("campaigns.start_due", "t"),
    ]
    assert queued["celery"] == [("events.drain", None), ("events.drain", "demo"), ("events.prune", None)]


def test_a_worker_started_without_q_consumes_every_queue() -> None:
    assert set(app.amqp.queues) == set(QUEUES)
    # Each queue its own binding: a message routed to one queue reaches only that one.
    assert {name: (q.exchange.name, q.routing_key) for name, q in app.amqp.queues.items()} == {
        name: (name, name) for name in QUEUES
    }
    assert app.conf.task_default_queue == "celery"
