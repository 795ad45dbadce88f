"""The reference CRM store: plain dictionaries behind one lock (one process).

Posting lists, counts and search entries are computed from the contacts on
each call (the definition the Kv store's indexes must agree with): O(tenant),
which is what a reference may cost.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from botmesh_admin.errors import Conflict, ValidationError
from botmesh_admin.pagination import validate_limit
from crm.domain import (
    ALL,
    MEMBER,
    Contact,
    Group,
    Identity,
    IdentityTaken,
    ImportJob,
    Segment,
    SegmentRules,
    Term,
    contact_terms,
    membership_groups,
    rules_match,
    search_index_keys,
    version_mismatch,
)

from .base import MAX_PAGE_FETCH, MAX_SCAN


@dataclass
class _Tenant:
    contacts: dict[str, Contact] = field(default_factory=dict)
    identities: dict[str, str] = field(default_factory=dict)  # "channel:address" -> contact id
    suppressions: dict[str, dict[str, Any]] = field(default_factory=dict)
    segments: dict[str, Segment] = field(default_factory=dict)
    jobs: dict[str, ImportJob] = field(default_factory=dict)
    job_data: dict[str, str] = field(default_factory=dict)


def _page(items: dict[str, Any], after: str | None, limit: int) -> list[Any]:
    validate_limit(limit, maximum=MAX_SCAN)
    keys = sorted(k for k in items if after is None or k > after)[:limit]
    return [items[k] for k in keys]


def _copy(contact: Contact, version: int) -> Contact:
    return replace(contact, version=version, attributes=dict(contact.attributes), consent=dict(contact.consent))


class MemoryContactStore:
    """``ContactStore`` in memory. Thread-safe; state lives as long as the instance."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tenants: dict[str, _Tenant] = {}

    def _t(self, tenant: str) -> _Tenant:
        return self._tenants.setdefault(tenant, _Tenant())

    # contacts

    def contact_get(self, tenant: str, contact_id: str) -> Contact | None:
        with self._lock:
            found = self._t(tenant).contacts.get(contact_id)
            return _copy(found, found.version) if found else None

    def contact_find(self, tenant: str, identity: Identity) -> Contact | None:
        with self._lock:
            t = self._t(tenant)
            owner = t.identities.get(identity.key)
            found = t.contacts.get(owner) if owner else None
            return _copy(found, found.version) if found else None

    def contact_find_many(self, tenant: str, identities: Sequence[Identity]) -> list[Contact | None]:
        return [self.contact_find(tenant, identity) for identity in identities]

    def _claim(self, t: _Tenant, contact: Contact) -> None:
        for ident in contact.identities:
            owner = t.identities.get(ident.key)
            if owner is not None and owner != contact.id:
                raise IdentityTaken(ident.key, owner)

    def contact_insert(self, tenant: str, contact: Contact) -> Contact:
        with self._lock:
            t = self._t(tenant)
            if contact.id in t.contacts:
                raise Conflict(f"contact {contact.id} exists", current_version=t.contacts[contact.id].version)
            self._claim(t, contact)
            stored = _copy(contact, 1)
            t.contacts[contact.id] = stored
            for ident in contact.identities:
                t.identities[ident.key] = contact.id
            return _copy(stored, 1)

    def contact_replace(
        self,
        tenant: str,
        contact: Contact,
        *,
        expected_version: int,
        release_suppressions: tuple[str, ...] = (),
    ) -> Contact:
        with self._lock:
            t = self._t(tenant)
            current = t.contacts.get(contact.id)
            if current is None or current.version != expected_version:
                raise version_mismatch("contact", current.version if current else None, expected_version)
            self._claim(t, contact)
            for ident in current.identities:
                t.identities.pop(ident.key, None)
            for ident in contact.identities:
                t.identities[ident.key] = contact.id
            for key in release_suppressions:
                t.suppressions.pop(key, None)
            stored = _copy(contact, expected_version + 1)
            t.contacts[contact.id] = stored
            return _copy(stored, stored.version)

    def contact_delete(
        self,
        tenant: str,
        contact_id: str,
        *,
        expected_version: int,
        suppressions: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        with self._lock:
            t = self._t(tenant)
            current = t.contacts.get(contact_id)
            if current is None or current.version != expected_version:
                raise version_mismatch("contact", current.version if current else None, expected_version)
            del t.contacts[contact_id]
            for ident in current.identities:
                t.identities.pop(ident.key, None)
            for key, record in (suppressions or {}).items():
                t.suppressions[key] = copy.deepcopy(dict(record))

    def contact_scan(self, tenant: str, *, after: str | None = None, limit: int = 100) -> list[Contact]:
        with self._lock:
            return [_copy(c, c.version) for c in _page(self._t(tenant).contacts, after, limit)]

    def contact_scan_matching(
        self, tenant: str, rules: SegmentRules, *, after: str | None = None, limit: int = 1000
    ) -> tuple[list[Contact], str | None]:
        with self._lock:
            page = _page(self._t(tenant).contacts, after, limit)
            matches = [_copy(c, c.version) for c in page if rules_match(rules, c)]
        return matches, page[-1].id if len(page) == limit else None

    def contact_get_many(self, tenant: str, contact_ids: Sequence[str]) -> list[Contact | None]:
        with self._lock:
            found = [self._t(tenant).contacts.get(i) for i in contact_ids]
            return [_copy(c, c.version) if c else None for c in found]

    def _terms(self, t: _Tenant) -> dict[str, set[Term]]:
        return {cid: set(contact_terms(c.to_json())) for cid, c in t.contacts.items()}

    def contact_count(self, tenant: str, terms: Sequence[Term]) -> list[int]:
        with self._lock:
            t = self._t(tenant)
            listed = self._terms(t)
            return [len(t.contacts) if term == ALL else sum(term in ts for ts in listed.values()) for term in terms]

    def contact_term_scan(self, tenant: str, term: Term, *, after: str | None = None, limit: int = 1000) -> list[str]:
        validate_limit(limit, maximum=MAX_SCAN)
        with self._lock:
            listed = self._terms(self._t(tenant))
        ids = sorted(cid for cid, ts in listed.items() if term in ts and (after is None or cid > after))
        return ids[:limit]

    def contact_term_page(
        self, tenant: str, term: Term, *, after: str | None = None, limit: int = 1000
    ) -> list[tuple[str, Contact | None]]:
        validate_limit(limit, maximum=MAX_PAGE_FETCH)
        ids = self.contact_term_scan(tenant, term, after=after, limit=limit)
        return list(zip(ids, self.contact_get_many(tenant, ids), strict=True))

    def contact_has_term(self, tenant: str, term: Term, contact_ids: Sequence[str]) -> list[bool]:
        with self._lock:
            contacts = self._t(tenant).contacts
            found = [contacts.get(i) for i in contact_ids]
            return [c is not None and term in contact_terms(c.to_json()) for c in found]

    def contact_search_scan(
        self, tenant: str, prefix: str, *, after: tuple[str, str] | None = None, limit: int = 1000
    ) -> list[tuple[str, str]]:
        validate_limit(limit, maximum=MAX_SCAN)
        if after is not None and not after[0].startswith(prefix):
            raise ValidationError("after", "not a cursor of this list")
        with self._lock:
            contacts = list(self._t(tenant).contacts.values())
        hits = sorted(
            (key, c.id)
            for c in contacts
            for key in search_index_keys(c.name, ((i.channel, i.address) for i in c.identities))
            if key.startswith(prefix)
        )
        return [h for h in hits if after is None or h > after][:limit]

    def contact_search_page(
        self, tenant: str, prefix: str, *, after: tuple[str, str] | None = None, limit: int = 1000
    ) -> list[tuple[tuple[str, str], Contact | None]]:
        validate_limit(limit, maximum=MAX_PAGE_FETCH)
        hits = self.contact_search_scan(tenant, prefix, after=after, limit=limit)
        return list(zip(hits, self.contact_get_many(tenant, [i for _, i in hits]), strict=True))

    def contact_match(self, tenant: str, contact_ids: Sequence[str], rules: SegmentRules) -> list[Contact]:
        return [c for c in self.contact_get_many(tenant, contact_ids) if c is not None and rules_match(rules, c)]

    def contact_match_count(self, tenant: str, contact_ids: Sequence[str], rules: SegmentRules) -> int:
        return len(self.contact_match(tenant, contact_ids, rules))

    # suppression list

    def suppression_get(self, tenant: str, key: str) -> Mapping[str, Any] | None:
        with self._lock:
            record = self._t(tenant).suppressions.get(key)
            return copy.deepcopy(record) if record is not None else None

    # segments

    def segment_get(self, tenant: str, segment_id: str) -> Segment | None:
        with self._lock:
            return self._t(tenant).segments.get(segment_id)

    def segment_insert(self, tenant: str, segment: Segment) -> Segment:
        with self._lock:
            t = self._t(tenant)
            if segment.id in t.segments:
                raise Conflict(f"segment {segment.id} exists", current_version=t.segments[segment.id].version)
            t.segments[segment.id] = replace(segment, version=1)
            return t.segments[segment.id]

    def segment_replace(self, tenant: str, segment: Segment, *, expected_version: int) -> Segment:
        with self._lock:
            t = self._t(tenant)
            current = t.segments.get(segment.id)
            if current is None or current.version != expected_version:
                raise version_mismatch("segment", current.version if current else None, expected_version)
            t.segments[segment.id] = replace(segment, version=expected_version + 1)
            return t.segments[segment.id]

    def segment_delete(self, tenant: str, segment_id: str) -> bool:
        with self._lock:
            return self._t(tenant).segments.pop(segment_id, None) is not None

    def segment_scan(self, tenant: str, *, after: str | None = None, limit: int = 100) -> list[Segment]:
        with self._lock:
            return _page(self._t(tenant).segments, after, limit)

    # segment membership: computed from the contacts on each call, so always "built"

    def membership_sync(self, tenant: str, segments: Sequence[Segment]) -> None:
        return None

    def membership_pending(self, tenant: str) -> list[str]:
        return []

    def membership_build(self, tenant: str, *, batch: int = 500, progress: Callable[[int], None] | None = None) -> int:
        return 0

    def _groups(self, tenant: str, segment: Segment) -> dict[str, list[Group]]:
        with self._lock:
            contacts = list(self._t(tenant).contacts.values())
        return {c.id: membership_groups(segment.rules, c.to_json()) for c in contacts}

    def membership_counts(
        self, tenant: str, segments: Sequence[Segment], groups: Sequence[Group]
    ) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for segment in segments:
            listed = self._groups(tenant, segment).values()
            out[segment.id] = [sum(g in gs for gs in listed) for g in groups]
        return out

    def membership_scan(
        self, tenant: str, segment: Segment, group: Group = MEMBER, *, after: str | None = None, limit: int = 100
    ) -> list[str] | None:
        validate_limit(limit, maximum=MAX_SCAN)
        ids = sorted(
            i for i, gs in self._groups(tenant, segment).items() if group in gs and (after is None or i > after)
        )
        return ids[:limit]

    def membership_check(self, tenant: str) -> dict[str, int]:
        with self._lock:
            return {"contacts": len(self._t(tenant).contacts), "wrong": 0}

    # import jobs

    def import_job_insert(self, tenant: str, job: ImportJob, data: str) -> ImportJob:
        with self._lock:
            t = self._t(tenant)
            if job.id in t.jobs:
                raise Conflict(f"import {job.id} exists", current_version=t.jobs[job.id].version)
            t.jobs[job.id] = replace(job, version=1)
            t.job_data[job.id] = data
            return t.jobs[job.id]

    def import_job_get(self, tenant: str, job_id: str) -> ImportJob | None:
        with self._lock:
            return self._t(tenant).jobs.get(job_id)

    def import_job_replace(self, tenant: str, job: ImportJob, *, expected_version: int) -> ImportJob:
        with self._lock:
            t = self._t(tenant)
            current = t.jobs.get(job.id)
            if current is None or current.version != expected_version:
                raise version_mismatch("import", current.version if current else None, expected_version)
            t.jobs[job.id] = replace(job, version=expected_version + 1)
            return t.jobs[job.id]

    def import_job_scan(self, tenant: str, *, after: str | None = None, limit: int = 100) -> list[ImportJob]:
        with self._lock:
            return _page(self._t(tenant).jobs, after, limit)

    def import_job_newest(self, tenant: str, *, limit: int = 20) -> list[ImportJob]:
        validate_limit(limit, maximum=MAX_SCAN)
        with self._lock:
            jobs = self._t(tenant).jobs
            return [jobs[k] for k in sorted(jobs, reverse=True)[:limit]]

    def import_data_get(self, tenant: str, job_id: str) -> str | None:
        with self._lock:
            return self._t(tenant).job_data.get(job_id)

    def import_data_delete(self, tenant: str, job_id: str) -> None:
        with self._lock:
            self._t(tenant).job_data.pop(job_id, None)
