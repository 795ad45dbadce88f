"""The journal pages: counts by state and channel, filtered list, DLQ, event detail, replay.

Readable without JavaScript (filters are a GET form, replay a POST form that
redirects back); with htmx the list refreshes itself every few seconds and a
replay swaps the refreshed fragment in place.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from botmesh_admin.errors import DomainError, ValidationError
from botmesh_admin.formerrors import error_text
from botmesh_admin.tenancy.decorators import list_query_checked, page_principal, render_error, tenant_page

from . import selectors, services
from .base import STATES, EventRecord
from .tasks import CHANNELS

PAGE_SIZE = 50
DLQ_SIZE = 20


def _time(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


def _row(record: EventRecord) -> dict[str, Any]:
    return {
        **record.__dict__,
        "created": _time(record.created_at),
        "available": _time(record.available_at),
        "leased_until_dt": _time(record.leased_until),
        "replayable": record.state in ("dead", "done"),
    }


def _filters(data: Any) -> dict[str, str]:
    """Return the list filters present in a GET or POST ``data`` (``state``, ``channel``, ``after``)."""
    out = {}
    for name in ("state", "channel", "after"):
        value = (data.get(name) or "").strip()
        if value:
            out[name] = value
    return out


def _context(tenant: str, filters: dict[str, str]) -> dict[str, Any]:
    state = filters.get("state")
    if state is not None and state not in STATES:
        raise ValidationError("state", f"must be one of {', '.join(STATES)}")
    channel_filter = filters.get("channel")
    channel = "" if channel_filter == "default" else channel_filter
    items, nxt = selectors.event_list(tenant, state=state, channel=channel, limit=PAGE_SIZE, after=filters.get("after"))
    dead, _ = selectors.event_list(tenant, state="dead", limit=DLQ_SIZE)
    summary = selectors.event_summary(tenant)
    channels = sorted({c or "default" for c in CHANNELS} | set(summary.by_channel))
    base_query = {k: v for k, v in filters.items() if k != "after"}
    return {
        "tenant": tenant,
        "summary": summary,
        "states": STATES,
        "channels": channels,
        "filters": filters,
        "rows": [_row(r) for r in items],
        "dead": [_row(r) for r in dead],
        "next_query": urlencode({**base_query, "after": nxt}) if nxt else None,
        "query": urlencode(filters),
    }


@tenant_page("admin")
def journal(request: HttpRequest, tenant: str) -> HttpResponse:
    """The journal page of ``tenant``."""
    with list_query_checked():
        context = _context(tenant, _filters(request.GET))
    return render(request, "events/journal.html", context)


@tenant_page("admin")
def journal_table(request: HttpRequest, tenant: str) -> HttpResponse:
    """The refreshable part of the journal page (htmx fragment)."""
    with list_query_checked():
        context = _context(tenant, _filters(request.GET))
    return render(request, "events/_journal.html", context)


@tenant_page("admin")
def event_detail(request: HttpRequest, tenant: str, event_id: str) -> HttpResponse:
    """One event: envelope, delivery state, payload and last error."""
    record = selectors.event_get(tenant, event_id=event_id)
    payload = json.dumps(record.payload, indent=2, ensure_ascii=False, sort_keys=True)
    return render(request, "events/detail.html", {"tenant": tenant, "event": _row(record), "payload": payload})


@require_POST
@tenant_page("admin")
def event_replay(request: HttpRequest, tenant: str, event_id: str) -> HttpResponse:
    """Replay a dead or done event; htmx gets the refreshed fragment, others a redirect.

    A done event was handled already: replaying it runs its handler again, so
    that asks first (``hx-confirm``; without JavaScript ``confirm_page``, whose
    form posts to this address: the forms carry ``from`` and the filters in its
    query for that). A dead letter replays in one click.
    """
    from botmesh_admin.confirmation import confirm_page, confirmed, done

    actor = page_principal(request).actor
    filters = _filters(request.POST) or _filters(request.GET)
    source = request.POST.get("from") or request.GET.get("from")
    htmx = bool(request.headers.get("HX-Request"))
    list_url = reverse("events:list", kwargs={"tenant": tenant})
    back = (
        reverse("events:detail", kwargs={"tenant": tenant, "event_id": event_id})
        if source == "detail"
        else (f"{list_url}?{urlencode(filters)}" if filters else list_url)
    )
    try:
        if not confirmed(request) and selectors.event_get(tenant, event_id=event_id).state == "done":
            return confirm_page(
                request,
                question=f"Replay event {event_id}? It was handled already.",
                consequences=(
                    "It goes back to pending and its handler runs again, as if it had just arrived.",
                    "What the handler does that is not idempotent may happen twice.",
                ),
                button="Replay it again",
                cancel_url=back,
            )
        record = services.event_replay(tenant, event_id=event_id, actor=actor)
    except DomainError as exc:
        if exc.status == 404 or getattr(exc, "field", None) == "event_id":
            # An event this tenant has not (another tenant's, a mistyped id) is the 404 page, as its
            # detail address is (tenant_page words a bad id so): a redirect to the list with a flash
            # answered 200 and named nothing.
            raise
        if htmx:
            return render_error(request, exc)
        messages.error(request, error_text(exc))
    else:
        if htmx and source == "detail":
            messages.success(request, f"Event {record.id} replayed: pending again.")
            return done(request, back)
        if htmx:
            context = _context(tenant, filters)
            context["flash"] = f"Event {record.id} replayed: pending again."
            return render(request, "events/_journal.html", context)
        messages.success(request, f"Event {record.id} replayed: pending again.")
    return redirect(back)
