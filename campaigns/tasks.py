"""Celery tasks of the campaigns package: thin wrappers over services (STYLE §9).

``campaigns.run`` sends one campaign (acks late: a worker killed mid-run gets
its message redelivered, and the run resumes from the slots); the durable
scheduled job ``campaigns.tick`` starts scheduled campaigns when due and
re-dispatches running campaigns no worker is sending (ARCHITECTURE §9).
A run stopped by the worker's shutdown (SIGTERM) is requeued, so the worker
that comes next sends the rest.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Task, shared_task

from botmesh_admin.coordination.registry import scheduled_job
from botmesh_admin.observability import shutdown

from . import services
from .domain import now_ms

log = logging.getLogger("botmesh.campaigns")


@shared_task(bind=True, name="campaigns.run", acks_late=True, ignore_result=True, max_retries=None)
def campaign_run(self: Task, tenant: str, campaign_id: str) -> str:
    """Send the campaign until it is done, paused or cancelled; return its state."""
    return run_or_requeue(self, tenant, campaign_id)


def run_or_requeue(task: Task, tenant: str, campaign_id: str, **run: Any) -> str:
    """Run the campaign (``services.campaign_run(**run)``); if the worker's shutdown stopped it, requeue it.

    The batch in flight was finished and recorded; the requeued message
    (``task.retry``, due at once) is taken by the next worker, which sends the
    rest. Raise celery's ``Retry`` in that case; else return the state.
    """
    state = services.campaign_run(tenant, campaign_id, **run).state
    if state == "running" and shutdown.stopping():
        log.info(
            "campaign %s tenant=%s: stopped by the worker's shutdown; requeued for the next worker", campaign_id, tenant
        )
        raise task.retry(countdown=0, max_retries=None)
    return state


@shared_task(name="campaigns.start_due", acks_late=True, ignore_result=True)
def campaign_start_due(tenant: str, campaign_id: str) -> str:
    """Start a scheduled campaign at its time (a no-op if it started already or was changed)."""
    campaign = services.campaign_start_due(tenant, campaign_id)
    if campaign.state == "running":
        services.campaign_run(tenant, campaign_id)
    return campaign.state


@scheduled_job(
    "campaigns.tick",
    every_s=10,
    catch_up="latest",
    catch_up_window_s=600,
    lease_s=60,
    description="Start scheduled campaigns when due; resume running campaigns no worker is sending.",
)
@shared_task(name="campaigns.tick", ignore_result=True)
def campaigns_tick() -> dict[str, int]:
    """Start due scheduled campaigns and re-dispatch stalled running ones."""
    return services.campaigns_tick()


def dispatch_run(tenant: str, campaign_id: str) -> None:
    """Queue ``campaigns.run`` (after the campaign's state was committed to the Kv)."""
    campaign_run.delay(tenant, campaign_id)


def dispatch_start_due(tenant: str, campaign_id: str, at_ms: int) -> None:
    """Queue ``campaigns.start_due`` for ``at_ms`` (punctuality; the tick job is the guarantee)."""
    campaign_start_due.apply_async((tenant, campaign_id), countdown=max(0.0, (at_ms - now_ms()) / 1000))
