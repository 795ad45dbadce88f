"""``/api/v1/tenants/{tenant}/events…`` — the tenant's journal: list, get, counts, replay."""

from __future__ import annotations

from typing import Any, Literal

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema

from botmesh_admin.api import CursorParams, ErrorOut, Page, principal, requires

from . import selectors, services
from .base import EventRecord

router = Router(tags=["events"])


class EventOut(Schema):
    """One journal record. Times are epoch milliseconds."""

    id: str
    type: str
    channel: str | None
    tenant: str
    payload: dict[str, Any]
    idempotency_key: str
    created_at: int
    state: str
    attempts: int
    available_at: int
    leased_until: int | None
    fencing_token: int
    last_error: str | None


class EventFilters(CursorParams):
    """``state`` and ``channel`` (``default`` = records without a channel) narrow the list."""

    state: Literal["pending", "leased", "done", "dead"] | None = None
    channel: str | None = Field(None, max_length=63)


class EventCountsOut(Schema):
    """Counts by state, and by channel then state (``default`` = no channel)."""

    by_state: dict[str, int]
    by_channel: dict[str, dict[str, int]]
    total: int


def _out(record: EventRecord) -> EventOut:
    return EventOut(**record.__dict__)


@router.get("events", response={200: Page[EventOut], 422: ErrorOut})
@requires("admin")
def event_list(request: HttpRequest, tenant: str, filters: Query[EventFilters]) -> dict[str, Any]:
    """List the tenant's events, newest first; pass ``next`` back as ``after`` (admins only)."""
    channel = "" if filters.channel == "default" else filters.channel
    items, nxt = selectors.event_list(
        tenant, state=filters.state, channel=channel, limit=filters.limit, after=filters.after
    )
    return {"items": [_out(r) for r in items], "next": nxt}


@router.get("event-counts", response={200: EventCountsOut})
@requires("admin")
def event_counts(request: HttpRequest, tenant: str) -> EventCountsOut:
    """Return the tenant's event counts by state and by channel (admins only)."""
    summary = selectors.event_summary(tenant)
    return EventCountsOut(by_state=summary.by_state, by_channel=summary.by_channel, total=summary.total)


@router.get("events/{event_id}", response={200: EventOut, 404: ErrorOut})
@requires("admin")
def event_get(request: HttpRequest, tenant: str, event_id: str) -> EventOut:
    """Return one event of the tenant (404 for another tenant's; admins only)."""
    return _out(selectors.event_get(tenant, event_id=event_id))


@router.post("events/{event_id}/replay", response={200: EventOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut})
@requires("admin")
def event_replay(request: HttpRequest, tenant: str, event_id: str) -> EventOut:
    """Put a dead or done event back to pending (admins only); 409 if it is pending or leased."""
    p = principal(request)
    return _out(services.event_replay(tenant, event_id=event_id, actor=p.actor))
