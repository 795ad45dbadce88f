"""The CRM store over any DurableKv (ARCHITECTURE §4), through ``TenantKv(kv, "crm")``.

Layout per tenant:

- ``crm/<tenant>/contacts``: ``c/<contact id>`` → contact JSON, ``i/<channel>:<address>``
  → ``{"contact": id}`` (the identity index) and ``s/<keyed hash>`` → suppression
  record. They share one table because a Kv commit is atomic inside one table:
  a contact, its identity claims (``ABSENT`` puts) and, on erasure, its
  suppression entries are written together or not at all.
- ``crm/<tenant>/segments``: ``<segment id>`` → segment JSON.
- ``crm/<tenant>/imports``: ``j/<job id>`` → job JSON, ``d/<job id>/<nnnn>`` → CSV text chunks.

A contact's ``version`` is its Kv entry version (ids are never reused).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from botmesh_admin.errors import Conflict, NotFound
from botmesh_admin.kv import ABSENT, ANY, ConflictError, Delete, DurableKv, Op, Put, TenantKv
from crm.domain import (
    Contact,
    Identity,
    IdentityTaken,
    ImportJob,
    Segment,
    SegmentRules,
    contact_from_json,
    contact_to_json,
    import_job_from_json,
    import_job_to_json,
    rules_match_json,
    segment_from_json,
    segment_to_json,
    version_mismatch,
)

from .base import check_scan_limit

CHUNK_CHARS = 1_000_000


class KvContactStore:
    """``ContactStore`` over a DurableKv; safe across threads and processes."""

    def __init__(self, kv: DurableKv) -> None:
        self.kv = kv
        self.tables = TenantKv(kv, "crm")

    def _contacts(self, tenant: str) -> str:
        return self.tables.table(tenant, "contacts")

    # contacts

    def contact_get(self, tenant: str, contact_id: str) -> Contact | None:
        entry = self.kv.get(self._contacts(tenant), f"c/{contact_id}")
        return contact_from_json(entry.value, entry.version) if entry else None

    def contact_find(self, tenant: str, identity: Identity) -> Contact | None:
        table = self._contacts(tenant)
        for _ in range(3):  # the owner may be replaced between the two reads
            index = self.kv.get(table, f"i/{identity.key}")
            if index is None:
                return None
            entry = self.kv.get(table, f"c/{index.value['contact']}")
            if entry is not None:
                return contact_from_json(entry.value, entry.version)
        return None

    def _identity_taken(self, table: str, key: str) -> IdentityTaken:
        index = self.kv.get(table, key)
        return IdentityTaken(key[2:], index.value["contact"] if index else None)

    def contact_insert(self, tenant: str, contact: Contact) -> Contact:
        table = self._contacts(tenant)
        ops: list[Op] = [Put(f"c/{contact.id}", contact_to_json(contact), ABSENT)]
        ops += [Put(f"i/{i.key}", {"contact": contact.id}, ABSENT) for i in contact.identities]
        try:
            entry = self.kv.commit(table, ops)[0]
        except ConflictError as exc:
            if exc.key.startswith("i/"):
                raise self._identity_taken(table, exc.key) from None
            raise Conflict(f"contact {contact.id} exists", current_version=exc.current_version) from None
        assert entry is not None
        return contact_from_json(entry.value, entry.version)

    def contact_replace(
        self,
        tenant: str,
        contact: Contact,
        *,
        expected_version: int,
        release_suppressions: tuple[str, ...] = (),
    ) -> Contact:
        table = self._contacts(tenant)
        current = self.kv.get(table, f"c/{contact.id}")
        if current is None:
            raise NotFound("contact not found")
        if current.version != expected_version:
            raise Conflict(
                f"contact changed: expected version {expected_version}, found {current.version}",
                current_version=current.version,
            )
        before = {f"i/{ch}:{addr}" for ch, addr in current.value["identities"]}
        after = {f"i/{i.key}" for i in contact.identities}
        ops: list[Op] = [Put(f"c/{contact.id}", contact_to_json(contact), expected_version)]
        ops += [Put(key, {"contact": contact.id}, ABSENT) for key in sorted(after - before)]
        ops += [Delete(key, ANY) for key in sorted(before - after)]
        ops += [Delete(f"s/{key}", ANY) for key in dict.fromkeys(release_suppressions)]
        try:
            entry = self.kv.commit(table, ops)[0]
        except ConflictError as exc:
            if exc.key.startswith("i/"):
                raise self._identity_taken(table, exc.key) from None
            raise version_mismatch("contact", exc.current_version, expected_version) from None
        assert entry is not None
        return contact_from_json(entry.value, entry.version)

    def contact_delete(
        self,
        tenant: str,
        contact_id: str,
        *,
        expected_version: int,
        suppressions: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        table = self._contacts(tenant)
        current = self.kv.get(table, f"c/{contact_id}")
        if current is None:
            raise NotFound("contact not found")
        ops: list[Op] = [Delete(f"c/{contact_id}", expected_version)]
        ops += [Delete(f"i/{ch}:{addr}", ANY) for ch, addr in current.value["identities"]]
        ops += [Put(f"s/{key}", dict(record), ANY) for key, record in (suppressions or {}).items()]
        try:
            self.kv.commit(table, ops)
        except ConflictError as exc:
            raise version_mismatch("contact", exc.current_version, expected_version) from None

    def contact_scan(self, tenant: str, *, after: str | None = None, limit: int = 100) -> list[Contact]:
        check_scan_limit(limit)
        entries = self.kv.scan(
            self._contacts(tenant), prefix="c/", after=f"c/{after}" if after else None, limit=limit
        )
        return [contact_from_json(e.value, e.version) for e in entries]

    def contact_scan_matching(
        self, tenant: str, rules: SegmentRules, *, after: str | None = None, limit: int = 1000
    ) -> tuple[list[Contact], str | None]:
        check_scan_limit(limit)
        entries = self.kv.scan(
            self._contacts(tenant), prefix="c/", after=f"c/{after}" if after else None, limit=limit
        )
        # Test the rules on the stored JSON: only members are decoded into Contacts.
        matches = [contact_from_json(e.value, e.version) for e in entries if rules_match_json(rules, e.value)]
        return matches, entries[-1].key[2:] if len(entries) == limit else None

    # suppression list

    def suppression_get(self, tenant: str, key: str) -> Mapping[str, Any] | None:
        entry = self.kv.get(self._contacts(tenant), f"s/{key}")
        return entry.value if entry else None

    # segments

    def segment_get(self, tenant: str, segment_id: str) -> Segment | None:
        entry = self.kv.get(self.tables.table(tenant, "segments"), segment_id)
        return segment_from_json(entry.value, entry.version) if entry else None

    def segment_insert(self, tenant: str, segment: Segment) -> Segment:
        try:
            entry = self.kv.commit(
                self.tables.table(tenant, "segments"), [Put(segment.id, segment_to_json(segment), ABSENT)]
            )[0]
        except ConflictError as exc:
            raise Conflict(f"segment {segment.id} exists", current_version=exc.current_version) from None
        assert entry is not None
        return segment_from_json(entry.value, entry.version)

    def segment_replace(self, tenant: str, segment: Segment, *, expected_version: int) -> Segment:
        try:
            entry = self.kv.commit(
                self.tables.table(tenant, "segments"),
                [Put(segment.id, segment_to_json(segment), expected_version)],
            )[0]
        except ConflictError as exc:
            raise version_mismatch("segment", exc.current_version, expected_version) from None
        assert entry is not None
        return segment_from_json(entry.value, entry.version)

    def segment_delete(self, tenant: str, segment_id: str) -> bool:
        table = self.tables.table(tenant, "segments")
        if self.kv.get(table, segment_id) is None:
            return False
        self.kv.commit(table, [Delete(segment_id, ANY)])
        return True

    def segment_scan(self, tenant: str, *, after: str | None = None, limit: int = 100) -> list[Segment]:
        check_scan_limit(limit)
        entries = self.kv.scan(self.tables.table(tenant, "segments"), after=after, limit=limit)
        return [segment_from_json(e.value, e.version) for e in entries]

    # import jobs

    def _imports(self, tenant: str) -> str:
        return self.tables.table(tenant, "imports")

    def import_job_insert(self, tenant: str, job: ImportJob, data: str) -> ImportJob:
        chunks = [data[i : i + CHUNK_CHARS] for i in range(0, len(data), CHUNK_CHARS)] or [""]
        ops: list[Op] = [Put(f"j/{job.id}", import_job_to_json(job), ABSENT)]
        ops += [Put(f"d/{job.id}/{n:04d}", chunk, ANY) for n, chunk in enumerate(chunks)]
        try:
            entry = self.kv.commit(self._imports(tenant), ops)[0]
        except ConflictError as exc:
            raise Conflict(f"import {job.id} exists", current_version=exc.current_version) from None
        assert entry is not None
        return import_job_from_json(entry.value, entry.version)

    def import_job_get(self, tenant: str, job_id: str) -> ImportJob | None:
        entry = self.kv.get(self._imports(tenant), f"j/{job_id}")
        return import_job_from_json(entry.value, entry.version) if entry else None

    def import_job_replace(self, tenant: str, job: ImportJob, *, expected_version: int) -> ImportJob:
        try:
            entry = self.kv.commit(
                self._imports(tenant), [Put(f"j/{job.id}", import_job_to_json(job), expected_version)]
            )[0]
        except ConflictError as exc:
            raise version_mismatch("import", exc.current_version, expected_version) from None
        assert entry is not None
        return import_job_from_json(entry.value, entry.version)

    def import_job_scan(self, tenant: str, *, after: str | None = None, limit: int = 100) -> list[ImportJob]:
        check_scan_limit(limit)
        entries = self.kv.scan(
            self._imports(tenant), prefix="j/", after=f"j/{after}" if after else None, limit=limit
        )
        return [import_job_from_json(e.value, e.version) for e in entries]

    def _chunks(self, tenant: str, job_id: str) -> list[Any]:
        return self.kv.scan(self._imports(tenant), prefix=f"d/{job_id}/", limit=1000)

    def import_data_get(self, tenant: str, job_id: str) -> str | None:
        chunks = self._chunks(tenant, job_id)
        return "".join(e.value for e in chunks) if chunks else None

    def import_data_delete(self, tenant: str, job_id: str) -> None:
        keys = [e.key for e in self._chunks(tenant, job_id)]
        if keys:
            self.kv.commit(self._imports(tenant), [Delete(k, ANY) for k in keys])
