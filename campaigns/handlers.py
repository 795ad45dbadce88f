"""Journal handlers of the campaigns app (found by the events registry's autodiscovery).

- ``campaigns.run`` (channel ``campaigns-run``): send one campaign, ``payload = {"campaign_id": …}``
  (``services.campaign_run_event``; published by ``services.campaign_run_dispatch``).

Idempotent: a redelivered run sends only the recipients without an outcome.
"""

from __future__ import annotations

from botmesh_admin.events.base import EventRecord
from botmesh_admin.events.handlers import register

from .domain import RUN_EVENT


@register(RUN_EVENT)
def campaign_run(record: EventRecord) -> None:
    """Send the campaign of ``record`` until it is done, paused or cancelled (or this worker stops)."""
    from .services import campaign_run_event

    campaign_run_event(record)
