"""CRM reads: contacts, identities, segments and their members, import jobs, CSV export.

Lookups answer "not found" for missing and foreign objects alike (every read
is scoped to the caller's tenant by the store). Times are epoch milliseconds.
"""

from __future__ import annotations

import re
import threading
import time
import unicodedata
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from botmesh_admin.cursors import cursor_check
from botmesh_admin.errors import NotFound, ValidationError

from . import csvio
from .domain import (
    CHANNELS,
    Contact,
    Identity,
    ImportJob,
    Segment,
    SegmentRules,
    normalize_identity,
    normalize_tag,
    rules_match,
    segment_rules_from_input,
)
from .stores import default_store

SCAN_BATCH = 1000
SEGMENT_BATCH = 2000
CONTACT_CURSOR = re.compile(r"c_[0-9a-f]{22}")  # the id of a page's last contact (``new_id("c")``)
REGION_TTL_S = 60.0
_regions: dict[str, tuple[str, float]] = {}
_regions_lock = threading.Lock()


def tenant_region(tenant: str) -> str:
    """Return the tenant's default phone region (``Tenant.default_region``, "CO" if unset).

    Cached for a minute per process: the inbox calls this for every inbound message.
    """
    now = time.monotonic()
    with _regions_lock:
        cached = _regions.get(tenant)
    if cached and cached[1] > now:
        return cached[0]
    from botmesh_admin.tenancy.models import Tenant

    region = Tenant.objects.filter(id=tenant).values_list("default_region", flat=True).first() or "CO"
    with _regions_lock:
        _regions[tenant] = (region, now + REGION_TTL_S)
    return region


def tenant_region_forget(tenant: str | None = None) -> None:
    """Drop the cached region of ``tenant`` (or of every tenant) after it changed."""
    with _regions_lock:
        if tenant is None:
            _regions.clear()
        else:
            _regions.pop(tenant, None)


# --------------------------------------------------------------------------- contacts


def contact_get(tenant: str, contact_id: str) -> Contact:
    """Return the contact; raise ``NotFound`` if it is missing (or another tenant's)."""
    contact = default_store().contact_get(tenant, contact_id) if isinstance(contact_id, str) else None
    if contact is None:
        raise NotFound(f"contact {contact_id} not found")
    return contact


def contact_find_by_identity(tenant: str, *, channel: str, address: str) -> Contact | None:
    """Return the contact owning the identity after normalisation, or ``None``.

    Raise ``ValidationError`` for an unknown channel or a malformed address.
    """
    identity = Identity(channel, normalize_identity(channel, address, tenant_region(tenant)))
    return default_store().contact_find(tenant, identity)


def _fold(text: str) -> str:
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def _text_matches(contact: Contact, needle: str) -> bool:
    if needle in _fold(contact.name or ""):
        return True
    digits = "".join(ch for ch in needle if ch.isdigit())
    for ident in contact.identities:
        if needle in ident.address.casefold():
            return True
        if ident.channel == "whatsapp" and len(digits) >= 4 and digits == needle.replace(" ", "").lstrip("+"):
            if digits in ident.address:
                return True
    return False


def _parse_identity_filter(identity: str, tenant: str) -> Identity:
    channel, sep, address = identity.partition(":")
    if not sep or channel not in CHANNELS:
        raise ValidationError("identity", f"use <channel>:<address> with channel one of {', '.join(CHANNELS)}")
    return Identity(channel, normalize_identity(channel, address, tenant_region(tenant), field="identity"))


class ContactPage(NamedTuple):
    """One page of contacts; pass ``next`` back as ``after`` for the following page."""

    items: list[Contact]
    next: str | None


def contact_list(
    tenant: str,
    *,
    limit: int = 50,
    after: str | None = None,
    tag: str | None = None,
    q: str | None = None,
    identity: str | None = None,
) -> ContactPage:
    """Return contacts ordered by id (creation time), filtered by tag, text and identity.

    ``q`` matches the name (ignoring case and accents) or part of an address;
    ``identity`` is ``<channel>:<address>`` and is normalised first. ``limit``
    is 1..200. Raise ``ValidationError`` for a bad filter.
    """
    if not 1 <= limit <= 200:
        raise ValidationError("limit", "must be 1..200")
    after = cursor_check(after, CONTACT_CURSOR)
    store = default_store()
    if identity:
        found = store.contact_find(tenant, _parse_identity_filter(identity, tenant))
        return ContactPage([found] if found and (after is None or found.id > after) else [], None)
    wanted_tag = normalize_tag(tag, "tag") if tag else None
    needle = _fold(q.strip()) if q and q.strip() else None
    items: list[Contact] = []
    cursor = after
    while True:
        batch = store.contact_scan(tenant, after=cursor, limit=SCAN_BATCH if (wanted_tag or needle) else limit + 1)
        for contact in batch:
            if wanted_tag and wanted_tag not in contact.tags:
                continue
            if needle and not _text_matches(contact, needle):
                continue
            items.append(contact)
            if len(items) > limit:
                return ContactPage(items[:limit], items[limit - 1].id)
        if not batch or len(batch) < (SCAN_BATCH if (wanted_tag or needle) else limit + 1):
            return ContactPage(items, None)
        cursor = batch[-1].id


def contact_iter(tenant: str, *, batch: int = SCAN_BATCH) -> Iterator[Contact]:
    """Yield every contact of the tenant, by id, reading ``batch`` at a time."""
    store = default_store()
    cursor: str | None = None
    while True:
        page = store.contact_scan(tenant, after=cursor, limit=batch)
        yield from page
        if len(page) < batch:
            return
        cursor = page[-1].id


def contact_export_csv(tenant: str) -> Iterator[str]:
    """Yield the tenant's contacts as CSV text (see ``crm.csvio``); it imports back to the same contacts."""
    columns = csvio.export_columns(contact_iter(tenant))
    yield from csvio.format_csv([columns])
    yield from csvio.format_csv(csvio.export_row(columns, c) for c in contact_iter(tenant))


# --------------------------------------------------------------------------- segments


def segment_get(tenant: str, segment_id: str) -> Segment:
    """Return the segment; raise ``NotFound``."""
    segment = default_store().segment_get(tenant, segment_id) if isinstance(segment_id, str) else None
    if segment is None:
        raise NotFound(f"segment {segment_id} not found")
    return segment


def segment_list(tenant: str, *, limit: int = 200, after: str | None = None) -> list[Segment]:
    """Return the tenant's segments ordered by id (creation time)."""
    return default_store().segment_scan(tenant, after=after, limit=limit)


def _rules(tenant: str, segment_id_or_rules: str | SegmentRules | Mapping[str, Any]) -> SegmentRules:
    if isinstance(segment_id_or_rules, str):
        return segment_get(tenant, segment_id_or_rules).rules
    if isinstance(segment_id_or_rules, SegmentRules):
        return segment_id_or_rules
    return segment_rules_from_input(segment_id_or_rules)


def segment_members(
    tenant: str, segment_id_or_rules: str | SegmentRules | Mapping[str, Any]
) -> Iterator[Contact]:
    """Yield the contacts matching a saved segment (by id) or unsaved rules, by contact id.

    Raise ``NotFound`` for an unknown segment id, ``ValidationError`` for bad rules
    (both before the first contact is yielded).
    """
    rules = _rules(tenant, segment_id_or_rules)
    store = default_store()

    def members() -> Iterator[Contact]:
        cursor: str | None = None
        while True:
            matches, cursor = store.contact_scan_matching(tenant, rules, after=cursor, limit=SEGMENT_BATCH)
            yield from matches
            if cursor is None:
                return

    return members()


def segment_count(tenant: str, segment_id_or_rules: str | SegmentRules | Mapping[str, Any]) -> int:
    """Return how many contacts match now (a live count)."""
    return sum(1 for _ in segment_members(tenant, segment_id_or_rules))


@dataclass(frozen=True)
class SegmentPreview:
    """The live count and the first ``limit`` members."""

    count: int
    sample: list[Contact]


def segment_preview(
    tenant: str, segment_id_or_rules: str | SegmentRules | Mapping[str, Any], *, limit: int = 20
) -> SegmentPreview:
    """Return the live count and the first ``limit`` (0..200) members."""
    if not 0 <= limit <= 200:
        raise ValidationError("limit", "must be 0..200")
    count, sample = 0, list[Contact]()
    for contact in segment_members(tenant, segment_id_or_rules):
        count += 1
        if len(sample) < limit:
            sample.append(contact)
    return SegmentPreview(count, sample)


def segment_counts(tenant: str, segments: list[Segment]) -> dict[str, int]:
    """Return the live count of each segment in one pass over the contacts."""
    counts = {s.id: 0 for s in segments}
    for contact in contact_iter(tenant):
        for segment in segments:
            if rules_match(segment.rules, contact):
                counts[segment.id] += 1
    return counts


# --------------------------------------------------------------------------- imports


def import_job_get(tenant: str, job_id: str) -> ImportJob:
    """Return the import job with its progress and report; raise ``NotFound``."""
    job = default_store().import_job_get(tenant, job_id) if isinstance(job_id, str) else None
    if job is None:
        raise NotFound(f"import {job_id} not found")
    return job


def import_job_list(tenant: str, *, limit: int = 20) -> list[ImportJob]:
    """Return the most recent import jobs, newest first."""
    jobs: list[ImportJob] = []
    cursor: str | None = None
    while True:
        page = default_store().import_job_scan(tenant, after=cursor, limit=500)
        jobs.extend(page)
        if len(page) < 500:
            break
        cursor = page[-1].id
    return list(reversed(jobs))[:limit]
