"""Celery tasks of the inbox package: thin wrappers over services (STYLE §9).

The durable scheduled job ``inbox.tick`` (every ``domain.TICK_EVERY_S``
seconds) reopens snoozed conversations whose time has come and backfills read
markers stored before unread counts existed (ARCHITECTURE §9).
"""

from __future__ import annotations

from celery import shared_task

from botmesh_admin.coordination.registry import scheduled_job

from .domain import TICK_EVERY_S


@scheduled_job(
    "inbox.tick",
    every_s=TICK_EVERY_S,
    catch_up="latest",
    catch_up_window_s=600,
    lease_s=60,
    description="Reopen snoozed conversations whose time has come; backfill old read markers' counts.",
)
@shared_task(name="inbox.tick", ignore_result=True)
def inbox_tick() -> dict[str, int]:
    """Reopen due snoozed conversations and backfill read markers, over every tenant."""
    from . import services  # tasks import services inside the task (issue 14: no services <-> tasks cycle)

    return services.inbox_tick()
