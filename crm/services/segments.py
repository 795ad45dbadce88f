"""CRM writes: saved segments and their materialized membership.

Every function takes the tenant first, the rest keyword-only, validates its
input (``ValidationError`` names the field path) and only then writes through
the store. Times are epoch milliseconds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from botmesh_admin.errors import Conflict, NotFound, ValidationError, bounded
from botmesh_admin.ids import is_id
from botmesh_admin.kv.cas import CONTENDED_ATTEMPTS, cas_retry
from crm.domain import Segment, new_id, now_ms, segment_rules_from_input, validate_segment_name
from crm.selectors import segment_list
from crm.stores import default_store
from crm.stores.base import MAX_SCAN, StaleRevision

log = logging.getLogger(__name__)


def _segments_all(tenant: str) -> list[Segment]:
    return segment_list(tenant, limit=MAX_SCAN)


class _SegmentsMoved(Exception):
    """The tenant's segments changed while their membership definitions were written."""


def segment_membership_sync(tenant: str) -> list[str]:
    """Make the tenant's segment membership definitions its saved segments; return the ids still to build.

    Called after every segment write (and by the build job first, which
    repairs a sync lost to a crash between the segment's commit and this one).
    The segments are read after the definitions (inside the store's retry), so
    two concurrent segment writes both end up defined.
    """
    store = default_store()

    def attempt() -> None:
        segments = _segments_all(tenant)
        store.membership_sync(tenant, segments)
        if [(s.id, s.rules) for s in segments] != [(s.id, s.rules) for s in _segments_all(tenant)]:
            raise _SegmentsMoved  # a segment was saved or deleted while we wrote: its own sync may have lost

    try:
        # Only a revision miss or moved segments: a store's other Conflict is not retried here.
        cas_retry(
            attempt, what="segment definitions", retry_on=(StaleRevision, _SegmentsMoved), attempts=CONTENDED_ATTEMPTS
        )
    except Conflict:
        log.warning("crm segment definitions keep changing tenant=%s; the next build syncs them", tenant)
    return [sid for sid in store.membership_pending(tenant) if sid != "sweep"]


def segment_membership_build(tenant: str, *, progress: Callable[[int], None] | None = None) -> int:
    """Build the materialized membership of every segment not built yet (online, resumable).

    Return how many contacts were read. ``progress`` gets that number after
    each batch. A background job's cost: O(contacts).
    """
    segment_membership_sync(tenant)
    return default_store().membership_build(tenant, progress=progress)


def segment_create(tenant: str, *, name: str, rules: Mapping[str, Any]) -> Segment:
    """Save a segment; raise ``ValidationError`` naming the bad rule (``segment.rules.tags_all[0]``).

    A tenant has at most ``BOTMESH_CRM_MAX_SEGMENTS`` segments (every contact
    write judges each one): one more is refused (field ``segment``). The
    segment's membership is defined at once; the caller dispatches its build
    (``crm.tasks.dispatch_segment_build``), and until it is built its counts
    come from the posting lists.
    """
    at = now_ms()
    segment = Segment(
        id=new_id("s"),
        name=validate_segment_name(name),
        rules=segment_rules_from_input(rules),
        created_at=at,
        updated_at=at,
    )
    from django.conf import settings

    cap = int(settings.BOTMESH_CRM_MAX_SEGMENTS)
    if len(_segments_all(tenant)) >= cap:
        raise ValidationError(
            "segment", f"a tenant has at most {cap} segments (BOTMESH_CRM_MAX_SEGMENTS); delete one first"
        )
    saved = default_store().segment_insert(tenant, segment)
    segment_membership_sync(tenant)
    return saved


def segment_update(
    tenant: str,
    segment_id: str,
    *,
    expected_version: int,
    name: str | None = None,
    rules: Mapping[str, Any] | None = None,
) -> Segment:
    """Change a segment's name and/or rules at ``expected_version``; raise ``Conflict``/``NotFound``.

    New rules need their membership built again (the caller dispatches it);
    a new name keeps it.
    """
    store = default_store()
    current = store.segment_get(tenant, segment_id)
    if current is None:
        raise NotFound(f"segment {bounded(str(segment_id), 60)} not found")
    updated = replace(
        current,
        name=validate_segment_name(name) if name is not None else current.name,
        rules=segment_rules_from_input(rules) if rules is not None else current.rules,
        updated_at=now_ms(),
    )
    saved = store.segment_replace(tenant, updated, expected_version=expected_version)
    if saved.rules != current.rules:
        segment_membership_sync(tenant)
    return saved


class SegmentInUse(Conflict):
    """A draft, scheduled, running or paused campaign still sends to the segment. HTTP 409."""

    code = "segment_in_use"


def segment_delete(tenant: str, segment_id: str) -> None:
    """Delete a segment; raise ``NotFound``, or ``SegmentInUse`` (409) naming the campaigns that still need it.

    A campaign that is a draft, scheduled, running or paused reads its
    segment to plan, start or resume, so the segment stays until they are
    finished, cancelled or deleted; finished campaigns keep their counts and
    show "segment deleted".
    """
    from campaigns.selectors import campaigns_of_segment

    if not is_id(segment_id, "s"):  # no segment has it: nothing to look up
        raise NotFound(f"segment {bounded(str(segment_id), 60)} not found")
    needed = campaigns_of_segment(tenant, segment_id, limit=3).needed
    if needed:
        names = ", ".join(f"{c.name!r} ({c.state})" for c in needed)
        raise SegmentInUse(
            f"the segment is used by campaign{'s' if len(needed) > 1 else ''} {names}: finish, cancel or delete"
            f" {'them' if len(needed) > 1 else 'it'} first",
            campaigns=[c.id for c in needed],
        )
    if not default_store().segment_delete(tenant, segment_id):
        raise NotFound(f"segment {bounded(str(segment_id), 60)} not found")
    segment_membership_sync(tenant)
