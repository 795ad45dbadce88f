"""Journal handlers of the campaigns app (found by the events registry's autodiscovery).

- ``campaigns.run`` (channel ``campaigns-run``): send one campaign, ``payload = {"campaign_id": …}``
  (``services.campaign_run_event``; published by ``services.campaign_run_dispatch``).

Idempotent: a redelivered run sends only the recipients without an outcome. A
dead-lettered run leaves the campaign ``failed`` with the reason, not ``running``.
"""

from __future__ import annotations

from botmesh_admin.events.base import EventRecord
from botmesh_admin.events.handlers import register

from .domain import RUN_EVENT


def campaign_run_dead_lettered(record: EventRecord) -> None:
    """The dead-letter hook of ``campaigns.run``: the campaign becomes ``failed`` with the reason (Resume goes on)."""
    from .services import campaign_run_dead_lettered as mark_failed

    campaign_id = record.payload.get("campaign_id") if isinstance(record.payload, dict) else None
    if isinstance(campaign_id, str):
        mark_failed(record.tenant, campaign_id, event_id=record.id, error=record.last_error)


@register(RUN_EVENT, on_dead_letter=campaign_run_dead_lettered)
def campaign_run(record: EventRecord) -> None:
    """Send the campaign of ``record`` until it is done, paused or cancelled (or this worker stops)."""
    from .services import campaign_run_event

    campaign_run_event(record)
