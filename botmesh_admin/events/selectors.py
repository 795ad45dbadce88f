"""Reads of the event journal, always inside one tenant (Zulip-style lookups)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from botmesh_admin.errors import NotFound
from botmesh_admin.kv.tenant import validate_id
from botmesh_admin.pagination import cursor_check, page_of

from .base import MAX_LIST, STATES, EventRecord, validate_event_id
from .runtime import default_journal

# The list's cursor is the id of the last event of a page, as ``new_event_id`` makes them.
EVENT_CURSOR = re.compile(r"ev_[0-9a-f]{24}")


def event_get(tenant: str, *, event_id: str) -> EventRecord:
    """Return ``tenant``'s event ``event_id``; raise ``NotFound`` if missing or foreign."""
    validate_id(tenant, "tenant")
    record = default_journal().get(validate_event_id(event_id))
    if record is None or record.tenant != tenant:
        raise NotFound(f"event {event_id!r} not found")
    return record


def event_list(
    tenant: str,
    *,
    state: str | None = None,
    channel: str | None = None,
    limit: int = 50,
    after: str | None = None,
) -> tuple[list[EventRecord], str | None]:
    """Return one page of ``tenant``'s events (newest first) and the cursor of the next page.

    ``channel=""`` selects the default channel; ``None`` filters nothing. The
    cursor is ``None`` on the last page.
    """
    validate_id(tenant, "tenant")
    after = cursor_check(after, EVENT_CURSOR)
    fetch = min(limit + 1, MAX_LIST)  # one more than asked tells whether a next page exists
    rows = default_journal().list(tenant=tenant, state=state, channel=channel, limit=fetch, after=after)
    if len(rows) == limit == MAX_LIST:  # a full page of the most the journal lists: there may be more
        return rows, rows[-1].id
    page = page_of(rows, limit, cursor=lambda record: record.id)
    return page.items, page.next


@dataclass(frozen=True)
class JournalSummary:
    """Counts of one tenant's events: by state, by channel, and the full table."""

    by_state: dict[str, int]
    by_channel: dict[str, dict[str, int]] = field(default_factory=dict)
    total: int = 0


def event_summary(tenant: str) -> JournalSummary:
    """Return ``tenant``'s event counts by state and by channel (``"default"`` for none)."""
    validate_id(tenant, "tenant")
    counts = default_journal().counts(tenant)
    by_state = {state: 0 for state in STATES}
    by_channel: dict[str, dict[str, int]] = {}
    for (state, channel), n in sorted(counts.items(), key=lambda kv: (kv[0][1] or "", kv[0][0])):
        by_state[state] += n
        row = by_channel.setdefault(channel or "default", {s: 0 for s in STATES})
        row[state] += n
    return JournalSummary(by_state=by_state, by_channel=by_channel, total=sum(by_state.values()))
