"""Celery tasks of the campaigns package: thin wrappers over services (STYLE §9).

``campaigns.run`` sends one campaign (acks late: a worker killed mid-run gets
its message redelivered, and the run resumes from the slots); the durable
scheduled job ``campaigns.tick`` starts scheduled campaigns when due and
re-dispatches running campaigns no worker is sending (ARCHITECTURE §9).
"""

from __future__ import annotations

from celery import shared_task

from botmesh_admin.coordination.registry import scheduled_job

from . import services
from .domain import now_ms


@shared_task(name="campaigns.run", acks_late=True, ignore_result=True)
def campaign_run(tenant: str, campaign_id: str) -> str:
    """Send the campaign until it is done, paused or cancelled; return its state."""
    return services.campaign_run(tenant, campaign_id).state


@shared_task(name="campaigns.start_due", acks_late=True, ignore_result=True)
def campaign_start_due(tenant: str, campaign_id: str) -> str:
    """Start a scheduled campaign at its time (a no-op if it started already or was changed)."""
    campaign = services.campaign_start_due(tenant, campaign_id)
    if campaign.state == "running":
        services.campaign_run(tenant, campaign_id)
    return campaign.state


@scheduled_job("campaigns.tick", every_s=10, catch_up="latest", catch_up_window_s=600, lease_s=60,
               description="Start scheduled campaigns when due; resume running campaigns no worker is sending.")
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
