"""Celery tasks of the campaigns package: thin wrappers over services (STYLE §9).

A campaign's run is a journal event, not a task (``campaigns.handlers``). The
durable scheduled job ``campaigns.tick`` starts scheduled campaigns when due
and re-dispatches running campaigns no worker is sending (ARCHITECTURE §9);
``campaigns.start_due`` is queued with a countdown for punctuality. Services
import this module at module level (``campaign_start_due as
campaign_start_due_task``); the tasks import services inside the function.
"""

from __future__ import annotations

from celery import shared_task

from botmesh_admin.coordination.registry import scheduled_job


@shared_task(name="campaigns.start_due", acks_late=True, ignore_result=True)
def campaign_start_due(tenant: str, campaign_id: str) -> str:
    """Start a scheduled campaign at its time and publish its run (a no-op if it started already or was changed)."""
    from .services import campaign_run_dispatch
    from .services import campaign_start_due as start_due

    campaign = start_due(tenant, campaign_id)
    if campaign.state == "running":
        campaign_run_dispatch(tenant, campaign)
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
    from .services import campaigns_tick as tick

    return tick()
