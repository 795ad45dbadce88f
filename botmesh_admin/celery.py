"""The Celery app. Tasks live in each app's ``tasks.py`` and are thin (STYLE §9)."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, signals
from kombu import Exchange, Queue

from botmesh_admin import config

DEFAULT_QUEUE = "celery"
"""Scheduled jobs, journal pruning and sweeps, the default and demo journal channels."""
LIVE_QUEUE = "live"
"""Live messages: the drains of the ``inbound`` (webhooks) and ``outbox`` (agent and bot replies) channels."""
BULK_QUEUE = "bulk"
"""Bulk work: the drains of ``ledger`` (bot ledger pushes), ``crm-import`` (CSV imports), ``campaigns-run``
(campaign runs) and other channels; segment builds."""
LIVE_CHANNELS = frozenset({"inbound", "outbox"})
DEFAULT_CHANNELS = frozenset({None, "", "demo"})
BULK_TASKS = frozenset({"campaigns.start_due", "crm.segment_membership_build"})


def route_task(name: str, args: Any, kwargs: Any, options: Any, task: Any = None, **kw: Any) -> dict[str, str] | None:
    """Return the queue of task ``name`` (a Celery router): live messages never wait behind bulk work.

    ``events.drain`` goes by its journal channel (the ``channel`` keyword or the
    first argument): ``inbound`` and ``outbox`` to ``live``; the default and the
    demo channel to ``celery``; every other channel (``ledger``, ``crm-import``,
    ``campaigns-run``, …) to ``bulk``. The tasks in ``BULK_TASKS`` go to ``bulk``;
    the rest (``None``) to the default queue, ``celery``. A worker started
    without ``-Q`` consumes all three (README, Production).
    """
    if name == "events.drain":
        channel = (kwargs or {}).get("channel", args[0] if args else None)
        if channel in LIVE_CHANNELS:
            return {"queue": LIVE_QUEUE}
        return {"queue": DEFAULT_QUEUE if channel in DEFAULT_CHANNELS else BULK_QUEUE}
    if name in BULK_TASKS:
        return {"queue": BULK_QUEUE}
    return None


def lower_bulk_priority(worker: Any) -> int:
    """Lower the CPU priority of a worker that does not consume ``live``; return the increment applied.

    A worker whose queues (after ``-Q``) leave out ``LIVE_QUEUE`` does bulk work
    and scheduled jobs only: it adds ``BOTMESH_BULK_WORKER_NICE`` (0..19,
    default 10; 0 leaves it alone) to its niceness (``nice(2)``) before its pool
    starts, so the pool's processes inherit it. On a machine whose cores are all
    busy the kernel then runs the live worker and the web first, and bulk work
    uses what they leave (``bench/latency.py``; README, Production). A worker
    consuming ``live`` — alone, or without ``-Q`` — keeps its priority.
    Called from Celery's ``celeryd_after_setup`` signal (``-Q`` applied, pool
    not started).
    """
    from django.conf import settings

    increment = int(getattr(settings, "BOTMESH_BULK_WORKER_NICE", 0))
    queues = set(worker.app.amqp.queues.consume_from)
    if not increment or LIVE_QUEUE in queues:
        return 0
    os.nice(increment)
    return increment


FILESYSTEM_WORKER_WAIT_S = 0.1
"""How long a worker on the filesystem broker waits for a message before it acks what finished (seconds)."""


def _on_worker_setup(sender: Any = None, instance: Any = None, **kwargs: Any) -> None:
    import logging

    from botmesh_admin import filesystem_broker

    # A worker acks what finished between two waits for messages: see ``filesystem_broker.Transport``.
    filesystem_broker.Transport.worker_wait_s = FILESYSTEM_WORKER_WAIT_S
    increment = lower_bulk_priority(instance)
    if increment:
        logging.getLogger(__name__).info(
            "worker %s does no live work: its CPU priority is lowered (nice +%d)", sender, increment
        )


os.environ.setdefault("DJANGO_SETTINGS_MODULE", "botmesh_admin.settings")
config.load_or_exit()

app = Celery("botmesh_admin")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_default_queue = DEFAULT_QUEUE


def _queue(name: str) -> Queue:
    """A queue with a direct exchange and routing key of its own name.

    A bare ``Queue(name)`` takes Celery's default exchange *and* default routing key
    (``celery``/``celery``), so all three queues were bound alike: Redis still delivered
    by queue name, but a transport that routes by binding (the tests' ``memory://``)
    could put a message for one queue in another.
    """
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


app.conf.task_queues = (_queue(DEFAULT_QUEUE), _queue(LIVE_QUEUE), _queue(BULK_QUEUE))
app.conf.task_routes = (route_task,)
app.autodiscover_tasks(
    [
        "botmesh_admin.events",
        "botmesh_admin.coordination",
        "botmesh_admin.channels",
        "botmesh_admin.observability",
        "botmesh_admin.dashboard",
        "inbox",
        "crm",
        "campaigns",
        "hub",
        "deployments",
    ]
)

# A SIGTERM must reach the process that runs a campaign or a reply: the stop flag is shared with the
# prefork pool children (made before they fork), and a child's SIGTERM marks it stopping, not dead.
from botmesh_admin.observability import shutdown  # noqa: E402

signals.worker_init.connect(shutdown.prepare_worker, weak=False)
signals.celeryd_after_setup.connect(_on_worker_setup, weak=False)
signals.task_prerun.connect(shutdown.on_task_start, weak=False)
