"""The CRM store over any DurableKv (ARCHITECTURE §4), through ``TenantKv(kv, "crm")``.

Layout per tenant:

- ``crm/<tenant>/contacts``: ``c/<contact id>`` → contact JSON, ``i/<channel>:<address>``
  → ``{"contact": id}`` (the identity index) and ``s/<keyed hash>`` → suppression
  record. They share one table because a Kv commit is atomic inside one table:
  a contact, its identity claims (``ABSENT`` puts) and, on erasure, its
  suppression entries are written together or not at all.
  ``m/<contact id>`` → ``{"k": [[segment id, rules key, *group], …]}``, the contact's
  materialized segment membership (``crm.domain.membership_groups`` for every saved
  segment), ``g/segments`` → the definitions it is computed from and
  ``g/membership`` → what is built (see "Segment membership" below).
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

- ``segment``: ``x/segment/<segment id><rules key>member m/<id>`` for each segment the
  contact is a member of, ordered by contact id: a segment's members by page;
- ``segment_n``: a counter per segment, rules key and group (``member``, and the
  campaign planner's verdicts other than ``ok`` per channel).

Segment membership. ``g/segments`` holds ``{"s": {segment id: {"rules", "key"}}}``,
written by ``membership_sync`` whenever a segment is saved or deleted (at most
``BOTMESH_CRM_MAX_SEGMENTS`` of them, so a contact write judges a bounded number of
rules). Every contact write computes the contact's ``m/`` record from the
definitions it read (cached per process by version) and checks their version in
its commit, so a write never keeps membership of definitions that changed under
it. A segment is usable for reads once ``g/membership`` says ``built`` for its
id and rules key: at once for a tenant without contacts, otherwise after
``membership_build`` passed every contact (online, resumable, in batches that
check each contact's version; the definitions' version is checked too, and a
change restarts the pass). Reads of a segment that is not built fall back to
the posting lists (``crm.selectors``).

The identity claims ``i/…`` are not a secondary index but a uniqueness
constraint, written by hand with ``ABSENT`` puts in the same commit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from botmesh_admin.errors import Conflict, NotFound
from botmesh_admin.ids import is_id
from botmesh_admin.kv import (
    ABSENT,
    ANY,
    Check,
    ConflictError,
    Delete,
    DurableKv,
    Entry,
    Op,
    Put,
    TenantKv,
)
from botmesh_admin.kv.cas import CONTENDED_ATTEMPTS, cas_retry
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
from botmesh_admin.kv.tablecache import TableCache
from botmesh_admin.kv.validation import MAX_GET_MANY
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
    rules_match_json,
    search_index_keys,
    segment_rules_from_input,
    segment_rules_key,
    version_mismatch,
)

from .base import MAX_PAGE_FETCH, MAX_SCAN, StaleRevision

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
IMPORT_JOB = RecordType("import_job", "j/", (ValueIndex("job_newest", keys=_newest_first),), reuses_keys=False)


def _membership_keys(data: Mapping[str, Any]) -> list[tuple[str, ...]]:
    return [tuple(k) for k in data.get("k") or ()]


def _member_keys(data: Mapping[str, Any]) -> list[tuple[str, ...]]:
    # Only the members are listed (a preview's page); the planner's groups are counted only.
    return [tuple(k) for k in data.get("k") or () if k[2:] == list(MEMBER)]


# A contact's membership record lives and dies with the contact (never deleted before it:
# an emptied membership is written empty), so its versions only grow and ``old`` is trusted.
MEMBERSHIP = RecordType(
    "membership",
    "m/",
    (ValueIndex("segment", keys=_member_keys), CountIndex("segment_n", keys=_membership_keys)),
    reuses_keys=False,
)


def _verify_membership(kv: DurableKv, tenant: str) -> dict[str, int]:
    return {"contacts with wrong segment membership": KvContactStore(kv).membership_check(tenant)["wrong"]}


def _repair_membership(kv: DurableKv, tenant: str) -> None:
    KvContactStore(kv).membership_rebuild(tenant)


def _derive_membership(kv: DurableKv, tenant: str) -> int:
    """Define the membership of the saved segments (an installation older than it) and build it."""
    store = KvContactStore(kv)
    cas_retry(
        lambda: store.membership_sync(tenant, store.segment_scan(tenant, limit=5000)),
        what="segment membership",
        attempts=CONTENDED_ATTEMPTS,  # every contact write checks the definitions a build rewrites
        retry_on=StaleRevision,
        exhausted=lambda: Conflict("segment membership kept changing; try again"),
    )
    return store.membership_build(tenant)


CONTACTS = declare(
    "crm",
    "contacts",
    [CONTACT, MEMBERSHIP],
    verify=_verify_membership,
    repair=_repair_membership,
    derive=_derive_membership,
)
IMPORTS = declare("crm", "imports", [IMPORT_JOB])


def _contact(entry: Entry | None) -> Contact | None:
    return Contact.from_json(entry.value, entry.version) if entry is not None else None


def _search_hit(entry: Entry) -> tuple[str, str]:
    """Return the ``(search key, contact id)`` of a ``by_text`` index entry."""
    pk = entry.value["pk"]
    (key,) = decode(entry.key[len(TEXT_BASE) : -len(pk)])
    return str(key), pk[2:]


def _chunks(items: Sequence[str], size: int = MAX_GET_MANY) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


DEFS_KEY = "g/segments"
BUILD_KEY = "g/membership"
ALL_COUNTER = f"x/term_n/{encode(ALL)}"
REPAIR_ATTEMPTS = 1000  # membership_rebuild's mark was unbounded (an operator's --repair must not give up): ≤ ~50 s
SEGMENT_BASE = "x/segment/"


@dataclass(frozen=True)
class _Defs:
    """The membership definitions of a table as read: ``version`` ``None`` when absent."""

    version: int | None
    segments: tuple[tuple[str, str, SegmentRules], ...]  # (segment id, rules key, rules)

    @classmethod
    def of(cls, entry: Entry | None) -> _Defs:
        if entry is None:
            return cls(None, ())
        items = sorted((entry.value.get("s") or {}).items())
        return cls(
            entry.version,
            tuple((sid, d["key"], segment_rules_from_input(d["rules"])) for sid, d in items),
        )

    def check(self) -> Check:
        return Check(DEFS_KEY, ABSENT if self.version is None else self.version)

    def membership(self, data: Mapping[str, Any]) -> list[list[str]]:
        """Return the ``k`` list of the contact JSON ``data`` under these definitions (sorted)."""
        return sorted(
            [sid, key, *group] for sid, key, rules in self.segments for group in membership_groups(rules, data)
        )


# Per process, each table's definitions; a commit checks their version (forgotten when it moved).
_defs_cache: TableCache[_Defs] = TableCache(10_000)


def _build_state(entry: Entry | None) -> dict[str, Any]:
    value = dict(entry.value) if entry is not None else {}
    return {"built": dict(value.get("built") or {}), "pass": value.get("pass"), "sweep": bool(value.get("sweep"))}


class KvContactStore:
    """``ContactStore`` over a DurableKv; safe across threads and processes."""

    def __init__(self, kv: DurableKv) -> None:
        self.kv = kv
        self.tables = TenantKv(kv, "crm")
        self.contacts = CONTACTS.layout(kv)
        self.imports = IMPORTS.layout(kv)

    def _contacts(self, tenant: str) -> str:
        return self.tables.table(tenant, "contacts")

    def _membership_ops(
        self, defs: _Defs, contact_id: str, new: Mapping[str, Any] | None, stored: Entry | None
    ) -> tuple[list[Op], list[RecordChange]]:
        """Return the ops writing contact ``contact_id``'s membership for its JSON ``new``.

        ``stored`` is its ``m/`` record as read (its version is expected).
        A deleted contact (``new`` is ``None``) loses its record.
        """
        key = f"m/{contact_id}"
        old = stored.value if stored is not None else None
        expect = ABSENT if stored is None else stored.version
        if new is None:
            if stored is None:
                return [], []
            return [Delete(key, expect)], [RecordChange(MEMBERSHIP, key, old, None)]
        value = {"k": defs.membership(new)}
        if (stored is None and not value["k"]) or old == value:
            return [], []
        return [Put(key, value, expect)], [RecordChange(MEMBERSHIP, key, old, value)]

    def _write(self, table: str, attempt: Callable[[_Defs], tuple[list[Op], list[RecordChange]]]) -> list[Entry | None]:
        """Commit what ``attempt(defs)`` returns with the definitions' check; retry when they moved.

        ``attempt`` reads what it needs again on each call; a conflict on the
        definitions or on a membership record (the builder passed) retries,
        any other ``ConflictError`` is raised.
        """

        def commit() -> list[Entry | None]:
            defs = _defs_cache.load(self.kv, table, lambda: _Defs.of(self.kv.get(table, DEFS_KEY)))
            ops, changes = attempt(defs)
            try:
                return self.contacts.commit(table, [*ops, defs.check()], changes)
            except ConflictError as exc:
                if exc.key == DEFS_KEY:
                    _defs_cache.forget(self.kv, table)
                raise

        return cas_retry(
            commit,
            what="segment definitions",
            attempts=CONTENDED_ATTEMPTS,  # as crm.services.segments: the definitions a build rewrites
            retry_if=lambda exc: exc.key == DEFS_KEY or exc.key.startswith("m/"),
            exhausted=lambda: Conflict("segment definitions kept changing; try again"),
        )

    # contacts

    def contact_get(self, tenant: str, contact_id: str) -> Contact | None:
        if not is_id(contact_id, "c"):  # no contact has it (an address such as contacts/x%00y)
            return None
        entry = self.kv.get(self._contacts(tenant), f"c/{contact_id}")
        return Contact.from_json(entry.value, entry.version) if entry else None

    def contact_find(self, tenant: str, identity: Identity) -> Contact | None:
        table = self._contacts(tenant)
        for _ in range(3):  # the owner may be replaced between the two reads
            index = self.kv.get(table, f"i/{identity.key}")
            if index is None:
                return None
            entry = self.kv.get(table, f"c/{index.value['contact']}")
            if entry is not None:
                return Contact.from_json(entry.value, entry.version)
        return None

    def contact_find_many(self, tenant: str, identities: Sequence[Identity]) -> list[Contact | None]:
        table = self._contacts(tenant)
        out: list[Contact | None] = []
        for chunk in _chunks([i.key for i in identities]):
            owners = [
                e.value["contact"] if e is not None else None
                for e in self.kv.get_many(table, [f"i/{k}" for k in chunk])
            ]
            wanted = [f"c/{o}" for o in owners if o is not None]
            found = {e.key: e for e in self.kv.get_many(table, wanted) if e is not None} if wanted else {}
            for owner in owners:
                entry = None if owner is None else found.get(f"c/{owner}")
                out.append(None if entry is None else Contact.from_json(entry.value, entry.version))
        return out

    def _identity_taken(self, table: str, key: str) -> IdentityTaken:
        index = self.kv.get(table, key)
        return IdentityTaken(key[2:], index.value["contact"] if index else None)

    def contact_insert(self, tenant: str, contact: Contact) -> Contact:
        table = self._contacts(tenant)
        value = contact.to_json()

        def attempt(defs: _Defs) -> tuple[list[Op], list[RecordChange]]:
            ops: list[Op] = [Put(f"c/{contact.id}", value, ABSENT)]
            ops += [Put(f"i/{i.key}", {"contact": contact.id}, ABSENT) for i in contact.identities]
            changes = [RecordChange(CONTACT, f"c/{contact.id}", None, value)]
            more_ops, more_changes = self._membership_ops(defs, contact.id, value, None)
            return ops + more_ops, changes + more_changes

        try:
            entry = self._write(table, attempt)[0]
        except ConflictError as exc:
            if exc.key.startswith("i/"):
                raise self._identity_taken(table, exc.key) from None
            raise Conflict(f"contact {contact.id} exists", current_version=exc.current_version) from None
        assert entry is not None
        return Contact.from_json(entry.value, entry.version)

    def contact_insert_batch(self, tenant: str, contacts: Sequence[Contact]) -> None:
        """Store new contacts in one atomic commit with their identity claims and index upkeep.

        A bulk loader (benchmarks, seeding): raise ``ConflictError`` naming the
        first id or identity that exists, and then nothing of the batch is written.
        """
        values = [c.to_json() for c in contacts]

        def attempt(defs: _Defs) -> tuple[list[Op], list[RecordChange]]:
            ops: list[Op] = []
            changes: list[RecordChange] = []
            for contact, value in zip(contacts, values, strict=True):
                ops.append(Put(f"c/{contact.id}", value, ABSENT))
                ops += [Put(f"i/{i.key}", {"contact": contact.id}, ABSENT) for i in contact.identities]
                changes.append(RecordChange(CONTACT, f"c/{contact.id}", None, value))
                more_ops, more_changes = self._membership_ops(defs, contact.id, value, None)
                ops += more_ops
                changes += more_changes
            return ops, changes

        if contacts:
            self._write(self._contacts(tenant), attempt)

    def contact_replace(
        self,
        tenant: str,
        contact: Contact,
        *,
        expected_version: int,
        release_suppressions: tuple[str, ...] = (),
    ) -> Contact:
        table = self._contacts(tenant)
        value = contact.to_json()

        def attempt(defs: _Defs) -> tuple[list[Op], list[RecordChange]]:
            current, stored = self.kv.get_many(table, [f"c/{contact.id}", f"m/{contact.id}"])
            if current is None:
                raise NotFound("contact not found")
            if current.version != expected_version:
                raise Conflict(
                    f"contact changed: expected version {expected_version}, found {current.version}",
                    current_version=current.version,
                )
            before = {f"i/{ch}:{addr}" for ch, addr in current.value["identities"]}
            after = {f"i/{i.key}" for i in contact.identities}
            ops: list[Op] = [Put(f"c/{contact.id}", value, expected_version)]
            ops += [Put(key, {"contact": contact.id}, ABSENT) for key in sorted(after - before)]
            ops += [Delete(key, ANY) for key in sorted(before - after)]
            ops += [Delete(f"s/{key}", ANY) for key in dict.fromkeys(release_suppressions)]
            changes = [RecordChange(CONTACT, f"c/{contact.id}", current.value, value)]
            more_ops, more_changes = self._membership_ops(defs, contact.id, value, stored)
            return ops + more_ops, changes + more_changes

        try:
            entry = self._write(table, attempt)[0]
        except ConflictError as exc:
            if exc.key.startswith("i/"):
                raise self._identity_taken(table, exc.key) from None
            raise version_mismatch("contact", exc.current_version, expected_version) from None
        assert entry is not None
        return Contact.from_json(entry.value, entry.version)

    def contact_delete(
        self,
        tenant: str,
        contact_id: str,
        *,
        expected_version: int,
        suppressions: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        table = self._contacts(tenant)

        def attempt(defs: _Defs) -> tuple[list[Op], list[RecordChange]]:
            current, stored = self.kv.get_many(table, [f"c/{contact_id}", f"m/{contact_id}"])
            if current is None:
                raise NotFound("contact not found")
            if current.version != expected_version:
                raise version_mismatch("contact", current.version, expected_version)
            ops: list[Op] = [Delete(f"c/{contact_id}", expected_version)]
            ops += [Delete(f"i/{ch}:{addr}", ANY) for ch, addr in current.value["identities"]]
            ops += [Put(f"s/{key}", dict(record), ANY) for key, record in (suppressions or {}).items()]
            changes = [RecordChange(CONTACT, f"c/{contact_id}", current.value, None)]
            more_ops, more_changes = self._membership_ops(defs, contact_id, None, stored)
            return ops + more_ops, changes + more_changes

        try:
            self._write(table, attempt)
        except ConflictError as exc:
            raise version_mismatch("contact", exc.current_version, expected_version) from None

    def contact_scan(self, tenant: str, *, after: str | None = None, limit: int = 100) -> list[Contact]:
        validate_limit(limit, maximum=MAX_SCAN)
        entries = self.kv.scan(self._contacts(tenant), prefix="c/", after=f"c/{after}" if after else None, limit=limit)
        return [Contact.from_json(e.value, e.version) for e in entries]

    def contact_scan_matching(
        self, tenant: str, rules: SegmentRules, *, after: str | None = None, limit: int = 1000
    ) -> tuple[list[Contact], str | None]:
        validate_limit(limit, maximum=MAX_SCAN)
        entries = self.kv.scan(self._contacts(tenant), prefix="c/", after=f"c/{after}" if after else None, limit=limit)
        # Test the rules on the stored JSON: only members are decoded into Contacts.
        matches = [Contact.from_json(e.value, e.version) for e in entries if rules_match_json(rules, e.value)]
        return matches, entries[-1].key[2:] if len(entries) == limit else None

    def contact_get_many(self, tenant: str, contact_ids: Sequence[str]) -> list[Contact | None]:
        table = self._contacts(tenant)
        out: list[Contact | None] = []
        for chunk in _chunks(list(contact_ids)):
            for entry in self.kv.get_many(table, [f"c/{i}" for i in chunk]):
                out.append(Contact.from_json(entry.value, entry.version) if entry else None)
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

    def contact_term_scan(self, tenant: str, term: Term, *, after: str | None = None, limit: int = 1000) -> list[str]:
        validate_limit(limit, maximum=MAX_SCAN)
        cursor = f"{TERM_BASE}{encode(term)}c/{after}" if after is not None else None
        entries = self.contacts.scan(self._contacts(tenant), "by_term", term, after=cursor, limit=limit)
        return [e.value["pk"][2:] for e in entries]

    def contact_term_page(
        self, tenant: str, term: Term, *, after: str | None = None, limit: int = 1000
    ) -> list[tuple[str, Contact | None]]:
        validate_limit(limit, maximum=MAX_PAGE_FETCH)
        cursor = f"{TERM_BASE}{encode(term)}c/{after}" if after is not None else None
        pairs = self.contacts.scan_fetch(self._contacts(tenant), "by_term", term, after=cursor, limit=limit)
        return [(e.value["pk"][2:], _contact(record)) for e, record in pairs]

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
        validate_limit(limit, maximum=MAX_SCAN)
        cursor = f"{TEXT_BASE}{encode_component(after[0])}c/{after[1]}" if after is not None else None
        entries = self.contacts.scan(
            self._contacts(tenant), "by_text", (), text_prefix=prefix, after=cursor, limit=limit
        )
        return [_search_hit(e) for e in entries]

    def contact_search_page(
        self, tenant: str, prefix: str, *, after: tuple[str, str] | None = None, limit: int = 1000
    ) -> list[tuple[tuple[str, str], Contact | None]]:
        validate_limit(limit, maximum=MAX_PAGE_FETCH)
        cursor = f"{TEXT_BASE}{encode_component(after[0])}c/{after[1]}" if after is not None else None
        pairs = self.contacts.scan_fetch(
            self._contacts(tenant), "by_text", (), text_prefix=prefix, after=cursor, limit=limit
        )
        return [(_search_hit(e), _contact(record)) for e, record in pairs]

    def contact_match(self, tenant: str, contact_ids: Sequence[str], rules: SegmentRules) -> list[Contact]:
        # Test the rules on the stored JSON: only members are decoded into Contacts.
        return [
            Contact.from_json(e.value, e.version)
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
        if not is_id(segment_id, "s"):
            return None
        entry = self.kv.get(self.tables.table(tenant, "segments"), segment_id)
        return Segment.from_json(entry.value, entry.version) if entry else None

    def segment_insert(self, tenant: str, segment: Segment) -> Segment:
        try:
            entry = self.kv.commit(self.tables.table(tenant, "segments"), [Put(segment.id, segment.to_json(), ABSENT)])[
                0
            ]
        except ConflictError as exc:
            raise Conflict(f"segment {segment.id} exists", current_version=exc.current_version) from None
        assert entry is not None
        return Segment.from_json(entry.value, entry.version)

    def segment_replace(self, tenant: str, segment: Segment, *, expected_version: int) -> Segment:
        try:
            entry = self.kv.commit(
                self.tables.table(tenant, "segments"),
                [Put(segment.id, segment.to_json(), expected_version)],
            )[0]
        except ConflictError as exc:
            raise version_mismatch("segment", exc.current_version, expected_version) from None
        assert entry is not None
        return Segment.from_json(entry.value, entry.version)

    def segment_delete(self, tenant: str, segment_id: str) -> bool:
        table = self.tables.table(tenant, "segments")
        if not is_id(segment_id, "s") or self.kv.get(table, segment_id) is None:
            return False
        self.kv.commit(table, [Delete(segment_id, ANY)])
        return True

    def segment_scan(self, tenant: str, *, after: str | None = None, limit: int = 100) -> list[Segment]:
        validate_limit(limit, maximum=MAX_SCAN)
        entries = self.kv.scan(self.tables.table(tenant, "segments"), after=after, limit=limit)
        return [Segment.from_json(e.value, e.version) for e in entries]

    # segment membership

    def membership_sync(self, tenant: str, segments: Sequence[Segment]) -> None:
        """Make the membership definitions those of ``segments`` (all the tenant's saved ones).

        A segment whose rules key is unchanged keeps its built membership; a new
        or changed one waits for ``membership_build`` — except in a tenant without
        contacts, where it is built at once (the commit checks the contact
        counter's version, so a contact created meanwhile makes it read again).
        One compare-and-set: when the stored definitions, the build state or
        the contact counter moved since they were read it raises ``StaleRevision``
        and writes nothing; the caller reads the segments again and calls it
        again (``crm.services.segment_membership_sync``).
        """
        table = self._contacts(tenant)
        want = {s.id: {"rules": s.rules.to_json(), "key": segment_rules_key(s.rules)} for s in segments}

        defs_entry, build_entry, counter = self.kv.get_many(table, [DEFS_KEY, BUILD_KEY, ALL_COUNTER])
        have = dict(defs_entry.value.get("s") or {}) if defs_entry is not None else {}
        if have == want:
            return
        state = _build_state(build_entry)
        empty = counter is None or counter.value == 0
        removed = any(sid not in want or want[sid]["key"] != d["key"] for sid, d in have.items())
        if empty:
            state = {"built": {sid: d["key"] for sid, d in want.items()}, "pass": None, "sweep": False}
        else:
            state["built"] = {sid: k for sid, k in state["built"].items() if want.get(sid, {}).get("key") == k}
            state["sweep"] = state["sweep"] or removed
        ops: list[Op] = [
            Put(DEFS_KEY, {"s": want}, ABSENT if defs_entry is None else defs_entry.version),
            Put(BUILD_KEY, state, ABSENT if build_entry is None else build_entry.version),
            Check(ALL_COUNTER, ABSENT if counter is None else counter.version),
        ]
        try:
            self.kv.commit(table, ops)
        except ConflictError as exc:
            raise StaleRevision(
                "segment membership changed concurrently", current_version=exc.current_version
            ) from None
        _defs_cache.forget(self.kv, table)

    def membership_pending(self, tenant: str) -> list[str]:
        """Return the ids of the segments whose membership is not built (and ``"sweep"`` if one is due)."""
        defs_entry, build_entry = self.kv.get_many(self._contacts(tenant), [DEFS_KEY, BUILD_KEY])
        state = _build_state(build_entry)
        pending = [sid for sid, sid_key, _ in _Defs.of(defs_entry).segments if state["built"].get(sid) != sid_key]
        return pending + (["sweep"] if state["sweep"] else [])

    def membership_build(self, tenant: str, *, batch: int = 500, progress: Callable[[int], None] | None = None) -> int:
        """Bring every contact's membership up to the definitions; return how many contacts were read.

        Online and resumable: each batch commits the changed ``m/`` records
        (checking each contact's version and the definitions' version) with the
        pass's cursor in ``g/membership``; a killed run continues from it, and a
        change of the definitions restarts the pass. At the end every defined
        segment is marked built. ``progress`` gets the contacts read so far.
        """
        table = self._contacts(tenant)
        done = 0
        size = batch
        while True:
            defs_entry, build_entry = self.kv.get_many(table, [DEFS_KEY, BUILD_KEY])
            defs = _Defs.of(defs_entry)
            state = _build_state(build_entry)
            if all(state["built"].get(sid) == k for sid, k, _ in defs.segments) and not state["sweep"]:
                return done
            current = state["pass"] if state["pass"] and state["pass"].get("defs") == defs.version else None
            after = current["after"] if current else None
            rows = self.kv.scan(table, prefix="c/", after=after, limit=size)
            stored = self.kv.get_many(table, [f"m/{r.key[2:]}" for r in rows]) if rows else []
            ops: list[Op] = [defs.check()]
            changes: list[RecordChange] = []
            for row, entry in zip(rows, stored, strict=True):
                more_ops, more_changes = self._membership_ops(defs, row.key[2:], row.value, entry)
                if more_ops:
                    ops += [Check(row.key, row.version), *more_ops]
                    changes += more_changes
            if len(rows) < size:
                state = {"built": {sid: k for sid, k, _ in defs.segments}, "pass": None, "sweep": False}
            else:
                state["pass"] = {"after": rows[-1].key, "defs": defs.version}
            ops.append(Put(BUILD_KEY, state, ABSENT if build_entry is None else build_entry.version))
            try:
                self.contacts.commit(table, ops, changes)
            except ConflictError:
                size = max(10, size // 2)  # writers are busy here: take less at a time
                continue
            size = min(batch, size * 2)
            done += len(rows)
            if progress is not None:
                progress(done)

    def membership_rebuild(self, tenant: str) -> int:
        """Mark every segment not built and build the membership of every contact again (``--repair``)."""
        table = self._contacts(tenant)

        def attempt() -> None:
            entry = self.kv.get(table, BUILD_KEY)
            state: dict[str, Any] = {"built": {}, "pass": None, "sweep": True}
            self.kv.commit(table, [Put(BUILD_KEY, state, ABSENT if entry is None else entry.version)])

        cas_retry(
            attempt,
            what="segment membership",
            attempts=REPAIR_ATTEMPTS,
            exhausted=lambda: Conflict("segment membership kept changing; try again"),
        )
        return self.membership_build(tenant)

    def _built_keys(self, table: str, segments: Sequence[Segment]) -> dict[str, str]:
        """Return ``{segment id: rules key}`` of the ``segments`` whose membership is built."""
        state = _build_state(self.kv.get(table, BUILD_KEY))
        keys = {s.id: segment_rules_key(s.rules) for s in segments}
        return {sid: key for sid, key in keys.items() if state["built"].get(sid) == key}

    def membership_counts(
        self, tenant: str, segments: Sequence[Segment], groups: Sequence[Group]
    ) -> dict[str, list[int]]:
        table = self._contacts(tenant)
        built = self._built_keys(table, segments)
        wanted = [(sid, key, *g) for sid, key in built.items() for g in groups]
        counts: list[int] = []
        for start in range(0, len(wanted), MAX_GET_MANY):
            counts += self.contacts.count(table, "segment_n", wanted[start : start + MAX_GET_MANY])
        n = len(groups)
        return {sid: counts[i * n : (i + 1) * n] for i, sid in enumerate(built)}

    def membership_scan(
        self, tenant: str, segment: Segment, group: Group = MEMBER, *, after: str | None = None, limit: int = 100
    ) -> list[str] | None:
        validate_limit(limit, maximum=MAX_SCAN)
        table = self._contacts(tenant)
        key = self._built_keys(table, [segment]).get(segment.id)
        if key is None:
            return None
        values = (segment.id, key, *group)
        cursor = f"{SEGMENT_BASE}{encode(values)}m/{after}" if after is not None else None
        entries = self.contacts.scan(table, "segment", values, after=cursor, limit=limit)
        return [e.value["pk"][2:] for e in entries]

    def membership_check(self, tenant: str) -> dict[str, int]:
        """Compare every contact's membership with the definitions: ``{"contacts", "wrong"}``.

        A full scan (a background job's cost); a pass that is still building
        counts as no drift. ``wrong`` counts contacts whose ``m/`` record differs.
        """
        table = self._contacts(tenant)
        defs_entry, build_entry = self.kv.get_many(table, [DEFS_KEY, BUILD_KEY])
        defs = _Defs.of(defs_entry)
        state = _build_state(build_entry)
        built = _Defs(defs.version, tuple(d for d in defs.segments if state["built"].get(d[0]) == d[1]))
        keys = {(sid, key) for sid, key, _ in built.segments}
        contacts = wrong = 0
        after: str | None = None
        while True:
            rows = self.kv.scan(table, prefix="c/", after=after, limit=1000)
            stored = self.kv.get_many(table, [f"m/{r.key[2:]}" for r in rows]) if rows else []
            for row, entry in zip(rows, stored, strict=True):
                contacts += 1
                have = [k for k in (entry.value.get("k") or []) if (k[0], k[1]) in keys] if entry else []
                if have != built.membership(row.value):
                    wrong += 1
            if len(rows) < 1000:
                return {"contacts": contacts, "wrong": wrong}
            after = rows[-1].key

    # import jobs

    def _imports(self, tenant: str) -> str:
        return self.tables.table(tenant, "imports")

    def import_job_insert(self, tenant: str, job: ImportJob, data: str) -> ImportJob:
        chunks = [data[i : i + CHUNK_CHARS] for i in range(0, len(data), CHUNK_CHARS)] or [""]
        value = job.to_json()
        ops: list[Op] = [Put(f"j/{job.id}", value, ABSENT)]
        ops += [Put(f"d/{job.id}/{n:04d}", chunk, ANY) for n, chunk in enumerate(chunks)]
        change = RecordChange(IMPORT_JOB, f"j/{job.id}", None, value)
        try:
            entry = self.imports.commit(self._imports(tenant), ops, [change])[0]
        except ConflictError as exc:
            raise Conflict(f"import {job.id} exists", current_version=exc.current_version) from None
        assert entry is not None
        return ImportJob.from_json(entry.value, entry.version)

    def import_job_get(self, tenant: str, job_id: str) -> ImportJob | None:
        if not is_id(job_id, "imp"):
            return None
        entry = self.kv.get(self._imports(tenant), f"j/{job_id}")
        return ImportJob.from_json(entry.value, entry.version) if entry else None

    def import_job_replace(self, tenant: str, job: ImportJob, *, expected_version: int) -> ImportJob:
        table = self._imports(tenant)
        current = self.kv.get(table, f"j/{job.id}")
        if current is None or current.version != expected_version:
            raise version_mismatch("import", current.version if current else None, expected_version)
        value = job.to_json()
        change = RecordChange(IMPORT_JOB, f"j/{job.id}", current.value, value)
        try:
            entry = self.imports.commit(table, [Put(f"j/{job.id}", value, expected_version)], [change])[0]
        except ConflictError as exc:
            raise version_mismatch("import", exc.current_version, expected_version) from None
        assert entry is not None
        return ImportJob.from_json(entry.value, entry.version)

    def import_job_scan(self, tenant: str, *, after: str | None = None, limit: int = 100) -> list[ImportJob]:
        validate_limit(limit, maximum=MAX_SCAN)
        entries = self.kv.scan(self._imports(tenant), prefix="j/", after=f"j/{after}" if after else None, limit=limit)
        return [ImportJob.from_json(e.value, e.version) for e in entries]

    def import_job_newest(self, tenant: str, *, limit: int = 20) -> list[ImportJob]:
        validate_limit(limit, maximum=MAX_SCAN)
        table = self._imports(tenant)
        entries = self.imports.scan(table, "job_newest", limit=limit)
        return [ImportJob.from_json(e.value, e.version) for e in self.imports.fetch(table, entries) if e]

    def _data_chunks(self, tenant: str, job_id: str) -> list[Any]:
        return self.kv.scan(self._imports(tenant), prefix=f"d/{job_id}/", limit=1000)

    def import_data_get(self, tenant: str, job_id: str) -> str | None:
        chunks = self._data_chunks(tenant, job_id)
        return "".join(e.value for e in chunks) if chunks else None

    def import_data_delete(self, tenant: str, job_id: str) -> None:
        keys = [e.key for e in self._data_chunks(tenant, job_id)]
        if keys:
            self.kv.commit(self._imports(tenant), [Delete(k, ANY) for k in keys])
