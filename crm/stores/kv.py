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

Secondary indexes (``botmesh_admin.kv.indexes``, declared below as ``CONTACTS``
and ``IMPORTS``), kept in the commit that writes the record:

- ``by_term``: ``x/by_term/<term>c/<id>`` for each term of ``crm.domain.contact_terms``
  (tag, consent granted / denied per channel — unknown is neither —, reachable
  channel, typed attribute value): one posting list per term, ordered by contact id;
- ``term_n``: a counter per term, and one for ``ALL`` (every contact);
- ``by_text``: ``x/by_text/<search key>c/<id>`` for each key of
  ``crm.domain.search_index_keys`` (name words, email, phone digits), for
  search by prefix;
- ``job_newest``: import jobs newest first (the job id with its hex digits inverted).

The identity claims ``i/…`` are not a secondary index but a uniqueness
constraint, written by hand with ``ABSENT`` puts in the same commit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from botmesh_admin.errors import Conflict, NotFound
from botmesh_admin.kv import ABSENT, ANY, ConflictError, Delete, DurableKv, Entry, Op, Put, TenantKv
from botmesh_admin.kv.indexes import (
    CountIndex,
    RecordChange,
    RecordType,
    ValueIndex,
    declare,
    decode,
    encode,
    encode_component,
)
from botmesh_admin.kv.validation import MAX_GET_MANY
from crm.domain import (
    ALL,
    Contact,
    Identity,
    IdentityTaken,
    ImportJob,
    Segment,
    SegmentRules,
    Term,
    contact_from_json,
    contact_terms,
    contact_to_json,
    import_job_from_json,
    import_job_to_json,
    rules_match_json,
    search_index_keys,
    segment_from_json,
    segment_to_json,
    version_mismatch,
)

from .base import check_scan_limit

CHUNK_CHARS = 1_000_000
TEXT_BASE = "x/by_text/"
TERM_BASE = "x/by_term/"
_INVERT_HEX = str.maketrans("0123456789abcdef", "fedcba9876543210")


def _text_keys(data: Mapping[str, Any]) -> list[tuple[str]]:
    return [(k,) for k in sorted(search_index_keys(data.get("name"), data.get("identities") or ()))]


def _newest_first(data: Mapping[str, Any]) -> list[tuple[str]]:
    # Job ids are fixed-length and sort by creation; inverting the hex digits reverses that order.
    return [(str(data["id"]).translate(_INVERT_HEX),)]


# Contact and job ids are minted by ``new_id`` and never handed out twice (an
# erased contact's id is not reused), so the callers' ``old`` values are trusted.
CONTACT = RecordType(
    "contact",
    "c/",
    (
        ValueIndex("by_term", keys=contact_terms),
        CountIndex("term_n", keys=lambda d: [ALL, *contact_terms(d)]),
        ValueIndex("by_text", keys=_text_keys),
    ),
    reuses_keys=False,
)
IMPORT_JOB = RecordType(
    "import_job", "j/", (ValueIndex("job_newest", keys=_newest_first),), reuses_keys=False
)
CONTACTS = declare("crm", "contacts", [CONTACT])
IMPORTS = declare("crm", "imports", [IMPORT_JOB])


def _chunks(items: Sequence[str], size: int = MAX_GET_MANY) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class KvContactStore:
    """``ContactStore`` over a DurableKv; safe across threads and processes."""

    def __init__(self, kv: DurableKv) -> None:
        self.kv = kv
        self.tables = TenantKv(kv, "crm")
        self.contacts = CONTACTS.layout(kv)
        self.imports = IMPORTS.layout(kv)

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
        value = contact_to_json(contact)
        ops: list[Op] = [Put(f"c/{contact.id}", value, ABSENT)]
        ops += [Put(f"i/{i.key}", {"contact": contact.id}, ABSENT) for i in contact.identities]
        change = RecordChange(CONTACT, f"c/{contact.id}", None, value)
        try:
            entry = self.contacts.commit(table, ops, [change])[0]
        except ConflictError as exc:
            if exc.key.startswith("i/"):
                raise self._identity_taken(table, exc.key) from None
            raise Conflict(f"contact {contact.id} exists", current_version=exc.current_version) from None
        assert entry is not None
        return contact_from_json(entry.value, entry.version)

    def contact_insert_batch(self, tenant: str, contacts: Sequence[Contact]) -> None:
        """Store new contacts in one atomic commit with their identity claims and index upkeep.

        A bulk loader (benchmarks, seeding): raise ``ConflictError`` naming the
        first id or identity that exists, and then nothing of the batch is written.
        """
        ops: list[Op] = []
        changes: list[RecordChange] = []
        for contact in contacts:
            value = contact_to_json(contact)
            ops.append(Put(f"c/{contact.id}", value, ABSENT))
            ops += [Put(f"i/{i.key}", {"contact": contact.id}, ABSENT) for i in contact.identities]
            changes.append(RecordChange(CONTACT, f"c/{contact.id}", None, value))
        if ops:
            self.contacts.commit(self._contacts(tenant), ops, changes)

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
        value = contact_to_json(contact)
        ops: list[Op] = [Put(f"c/{contact.id}", value, expected_version)]
        ops += [Put(key, {"contact": contact.id}, ABSENT) for key in sorted(after - before)]
        ops += [Delete(key, ANY) for key in sorted(before - after)]
        ops += [Delete(f"s/{key}", ANY) for key in dict.fromkeys(release_suppressions)]
        change = RecordChange(CONTACT, f"c/{contact.id}", current.value, value)
        try:
            entry = self.contacts.commit(table, ops, [change])[0]
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
        if current.version != expected_version:
            raise version_mismatch("contact", current.version, expected_version)
        ops: list[Op] = [Delete(f"c/{contact_id}", expected_version)]
        ops += [Delete(f"i/{ch}:{addr}", ANY) for ch, addr in current.value["identities"]]
        ops += [Put(f"s/{key}", dict(record), ANY) for key, record in (suppressions or {}).items()]
        change = RecordChange(CONTACT, f"c/{contact_id}", current.value, None)
        try:
            self.contacts.commit(table, ops, [change])
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

    def contact_get_many(self, tenant: str, contact_ids: Sequence[str]) -> list[Contact | None]:
        table = self._contacts(tenant)
        out: list[Contact | None] = []
        for chunk in _chunks(list(contact_ids)):
            for entry in self.kv.get_many(table, [f"c/{i}" for i in chunk]):
                out.append(contact_from_json(entry.value, entry.version) if entry else None)
        return out

    def _entries(self, tenant: str, contact_ids: Sequence[str]) -> Iterable[Entry]:
        table = self._contacts(tenant)
        for chunk in _chunks(list(contact_ids)):
            yield from (e for e in self.kv.get_many(table, [f"c/{i}" for i in chunk]) if e is not None)

    def contact_count(self, tenant: str, terms: Sequence[Term]) -> list[int]:
        table = self._contacts(tenant)
        out: list[int] = []
        for start in range(0, len(terms), MAX_GET_MANY):
            out += self.contacts.count(table, "term_n", terms[start : start + MAX_GET_MANY])
        return out

    def contact_term_scan(
        self, tenant: str, term: Term, *, after: str | None = None, limit: int = 1000
    ) -> list[str]:
        check_scan_limit(limit)
        cursor = f"{TERM_BASE}{encode(term)}c/{after}" if after is not None else None
        entries = self.contacts.scan(self._contacts(tenant), "by_term", term, after=cursor, limit=limit)
        return [e.value["pk"][2:] for e in entries]

    def contact_has_term(self, tenant: str, term: Term, contact_ids: Sequence[str]) -> list[bool]:
        table = self._contacts(tenant)
        # ALL has no posting list: an empty scan whose only effect is the kernel's built check.
        self.contacts.scan(table, "by_term", ALL, limit=1)
        base = f"{TERM_BASE}{encode(term)}c/"
        out: list[bool] = []
        for chunk in _chunks(list(contact_ids)):
            out += [e is not None for e in self.kv.get_many(table, [base + i for i in chunk])]
        return out

    def contact_search_scan(
        self, tenant: str, prefix: str, *, after: tuple[str, str] | None = None, limit: int = 1000
    ) -> list[tuple[str, str]]:
        check_scan_limit(limit)
        cursor = f"{TEXT_BASE}{encode_component(after[0])}c/{after[1]}" if after is not None else None
        entries = self.contacts.scan(
            self._contacts(tenant), "by_text", (), text_prefix=prefix, after=cursor, limit=limit
        )
        out = []
        for e in entries:
            pk = e.value["pk"]
            (key,) = decode(e.key[len(TEXT_BASE) : -len(pk)])
            out.append((str(key), pk[2:]))
        return out

    def contact_match(self, tenant: str, contact_ids: Sequence[str], rules: SegmentRules) -> list[Contact]:
        # Test the rules on the stored JSON: only members are decoded into Contacts.
        return [
            contact_from_json(e.value, e.version)
            for e in self._entries(tenant, contact_ids)
            if rules_match_json(rules, e.value)
        ]

    def contact_match_count(self, tenant: str, contact_ids: Sequence[str], rules: SegmentRules) -> int:
        return sum(1 for e in self._entries(tenant, contact_ids) if rules_match_json(rules, e.value))

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
        value = import_job_to_json(job)
        ops: list[Op] = [Put(f"j/{job.id}", value, ABSENT)]
        ops += [Put(f"d/{job.id}/{n:04d}", chunk, ANY) for n, chunk in enumerate(chunks)]
        change = RecordChange(IMPORT_JOB, f"j/{job.id}", None, value)
        try:
            entry = self.imports.commit(self._imports(tenant), ops, [change])[0]
        except ConflictError as exc:
            raise Conflict(f"import {job.id} exists", current_version=exc.current_version) from None
        assert entry is not None
        return import_job_from_json(entry.value, entry.version)

    def import_job_get(self, tenant: str, job_id: str) -> ImportJob | None:
        entry = self.kv.get(self._imports(tenant), f"j/{job_id}")
        return import_job_from_json(entry.value, entry.version) if entry else None

    def import_job_replace(self, tenant: str, job: ImportJob, *, expected_version: int) -> ImportJob:
        table = self._imports(tenant)
        current = self.kv.get(table, f"j/{job.id}")
        if current is None or current.version != expected_version:
            raise version_mismatch("import", current.version if current else None, expected_version)
        value = import_job_to_json(job)
        change = RecordChange(IMPORT_JOB, f"j/{job.id}", current.value, value)
        try:
            entry = self.imports.commit(table, [Put(f"j/{job.id}", value, expected_version)], [change])[0]
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

    def import_job_newest(self, tenant: str, *, limit: int = 20) -> list[ImportJob]:
        check_scan_limit(limit)
        table = self._imports(tenant)
        entries = self.imports.scan(table, "job_newest", limit=limit)
        return [import_job_from_json(e.value, e.version) for e in self.imports.fetch(table, entries) if e]

    def _data_chunks(self, tenant: str, job_id: str) -> list[Any]:
        return self.kv.scan(self._imports(tenant), prefix=f"d/{job_id}/", limit=1000)

    def import_data_get(self, tenant: str, job_id: str) -> str | None:
        chunks = self._data_chunks(tenant, job_id)
        return "".join(e.value for e in chunks) if chunks else None

    def import_data_delete(self, tenant: str, job_id: str) -> None:
        keys = [e.key for e in self._data_chunks(tenant, job_id)]
        if keys:
            self.kv.commit(self._imports(tenant), [Delete(k, ANY) for k in keys])
