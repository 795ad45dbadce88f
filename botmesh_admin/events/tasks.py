"""Celery tasks of the event journal: thin wrappers over services (STYLE §9).

Services import this module at module level (``drain as drain_task``); the
tasks import services inside the function (HackSoft's styleguide), so the two
never form an import cycle (``tests/test_import_graph.py``).

``events.drain`` is queued by ``event_publish`` after commit; beat also drains
every known channel every few seconds as a safety net (a lost task message, a
broker outage, a retry whose backoff has just elapsed).
"""

from __future__ import annotations

import time
from typing import Any

from celery import shared_task

CHANNELS: tuple[str | None, ...] = (None, "inbound", "ledger", "outbox", "demo", "crm-import", "campaigns-run")
"""The channels in use: default (None), inbound webhooks, bot ledger pushes, outbox sends, the demo's fault,
CSV imports (``crm.handlers``), campaign runs (``campaigns.handlers``): beat drains each as a safety net."""
SAFETY_NET_S = 5.0
PRUNE_EVERY_S = 3600.0
DRAIN_BUDGET_S = 10.0
"""How long one drain task keeps taking batches before it queues its successor (seconds)."""


@shared_task(name="events.drain", ignore_result=True)
def drain(channel: str | None = None, limit: int = 100) -> dict[str, int]:
    """Handle the ready records of ``channel``, ``limit`` per batch, until none is ready; return the totals.

    A backlog (a large ledger push) is drained batch after batch rather than
    ``limit`` records per wake-up; after ``DRAIN_BUDGET_S`` the task queues its
    successor and returns, so other channels' drains get the worker in between.
    """
    from .services import journal_drain

    totals = {"processed": 0, "failed": 0, "stale": 0}
    deadline = time.monotonic() + DRAIN_BUDGET_S
    while True:
        counts = journal_drain(channel=channel, limit=limit)
        for key, value in counts.items():
            totals[key] += value
        if sum(counts.values()) < limit:
            return totals
        if time.monotonic() >= deadline:
            drain.delay(channel=channel, limit=limit)
            return totals


@shared_task(name="events.prune", ignore_result=True)
def prune() -> int:
    """Delete done records older than ``BOTMESH_JOURNAL_RETENTION_DAYS``; return how many."""
    from .services import journal_prune

    return journal_prune()


def beat_entries() -> dict[str, dict[str, Any]]:
    """Return the beat schedule entries that drain every known channel."""
    return {
        f"events.drain.{channel or 'default'}": {
            "task": "events.drain",
            "schedule": SAFETY_NET_S,
            "kwargs": {"channel": channel},
            "options": {"expires": SAFETY_NET_S * 2},
        }
        for channel in CHANNELS
    }


def retention_entries() -> dict[str, dict[str, Any]]:
    """Return the beat schedule entry that prunes old done records every hour."""
    return {
        "events.prune": {
            "task": "events.prune",
            "schedule": PRUNE_EVERY_S,
            "options": {"expires": PRUNE_EVERY_S},
        }
    }


def _register_beat(app: Any) -> None:
    schedule = dict(app.conf.beat_schedule or {})
    for name, entry in {**beat_entries(), **retention_entries()}.items():
        schedule.setdefault(name, entry)
    app.conf.beat_schedule = schedule


def _install() -> None:
    from botmesh_admin.celery import app

    # Tasks modules are usually imported after the app is configured (autodiscovery);
    # register now in that case, and on configuration otherwise.
    if app.configured:
        _register_beat(app)
    else:
        app.on_after_configure.connect(lambda sender, **kwargs: _register_beat(sender), weak=False)


_install()
