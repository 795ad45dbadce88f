"""The campaign stores over any DurableKv (ARCHITECTURE §4), through ``TenantKv(kv, "campaigns")``.

Layout:

- ``campaigns/<tenant>/campaigns``: ``<campaign id>`` → campaign JSON, and a
  value index by state (``CAMPAIGN``) so a list filtered by state is O(page).
- ``campaigns/<tenant>/d-<campaign id>``: ``d/<recipient>`` → the recipient's send
  slot, ``p/<recipient key>`` → ``{"contact"}`` (which contact the plan gave the
  recipient key to: the planner's exact dedupe, kept in the Kv so a 1,000,000
  recipient plan never holds its recipients in memory, and a re-run plan finds
  its own), and the slots' indexes under ``x/`` (``DELIVERY``: counters per state and per
  ``state:reason`` kept in each slot commit, so progress is O(1); value indexes
  by state, reason, state + reason and contact, so a filtered page is
  O(page)). One table per campaign, so a batch of slot changes is one atomic
  commit and deleting a campaign drops one table (indexes included).
- ``campaigns/<tenant>/throttle``: ``<channel>`` → ``{"next_ms"}`` (booked send times).
- ``campaigns/~system/index``: ``<tenant>!<campaign id>`` → ``{"state", "at"}``, the
  active campaigns the scheduler's tick reads (the one cross-tenant table; it
  holds ids only; ``!`` sorts before every id character, so keys sort as (tenant, id) pairs).
  A kernel namespace (``TenantKv.kernel_table``): no tenant id can name it.
  Earlier versions kept it in ``campaigns/system/index``; ``index_upgrade`` moves
  those entries (each tick's first page does it, and ``manage.py botmesh_upgrade``).

Versions are the Kv entry versions. Slot changes are compare-and-set on the
version the caller read; on a conflict the slot is read again and the rule
re-applied to what is there now.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from botmesh_admin.errors import Conflict, NotFound
from botmesh_admin.kv import ABSENT, ConflictError, Delete, DurableKv, Op, Put, TenantKv
from botmesh_admin.kv.cas import CAS_ATTEMPTS, cas_retry
from botmesh_admin.kv.indexes import (
    INDEX_ROOT,
    CountIndex,
    IndexedTable,
    RecordChange,
    RecordType,
    ValueIndex,
    declare,
    decode,
    encode,
)
from botmesh_admin.kv.tenant import on_tenant_erase, validate_tenant_id
from botmesh_admin.kv.validation import MAX_GET_MANY
from campaigns.domain import (
    REASON_STATES,
    Campaign,
    Delivery,
    DeliveryCounts,
)

from .base import Change, IndexEntry, SlotRules, VersionConflict, slot_matches, validate_scan_limit

SYSTEM = "system"  # the index's kernel namespace: campaigns/~system/index
SLOT = "d/"
PLAN = "p/"
SEP = "!"
COMMIT_BATCH = 500
CLAIM_BATCH = MAX_GET_MANY // 2  # a claim reads its plan record and its slot: one get_many per batch
MAX_REASONS = 10_000


def _reason_group(slot: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """The ``state:reason`` a slot counts under (``count_deliveries``: outcomes with a reason)."""
    state, reason = slot.get("state"), slot.get("reason")
    return [(state, reason)] if state in REASON_STATES and reason else []


def _has_reason(slot: Mapping[str, Any]) -> bool:
    return slot.get("reason") is not None


DELIVERY = RecordType(
    "delivery",
    SLOT,
    (
        # ``reads``: a reservation or an answer moves a slot's state, lease and attempts, never its
        # contact: the upkeep skips the indexes whose fields it left alone.
        CountIndex("delivery_count_state", fields=("state",), reads=("state",)),
        CountIndex("delivery_count_reason", keys=_reason_group, reads=("state", "reason")),
        ValueIndex("delivery_state", fields=("state",), reads=("state",)),
        ValueIndex("delivery_reason", fields=("reason",), where=_has_reason, reads=("reason",)),
        ValueIndex("delivery_state_reason", fields=("state", "reason"), where=_has_reason, reads=("state", "reason")),
        ValueIndex("delivery_contact", fields=("contact_id",), reads=("contact_id",)),
    ),
    # A slot key is never deleted on its own: only with its whole table (the campaign's
    # deletion once finished, tenant erasure), and campaign ids are never handed out twice.
    # So a slot's versions only grow and the kernel may trust the ``old`` a writer read:
    # no companion write and no read before each slot commit (a third of a batch's keys).
    # After such a drop, writers that expect a version find the key absent and conflict.
    reuses_keys=False,
)
"""A send slot (``d/<recipient>``, no Kv TTL: a reservation's lease is its ``lease_until``)."""


def _slot_tables(kv: DurableKv, tenant: str) -> Iterator[str]:
    """Yield the delivery collection of each campaign of ``tenant`` (``botmesh_reindex`` walks them)."""
    table, after = TenantKv(kv, "campaigns").table(tenant, "campaigns"), None
    while True:
        page = kv.scan(table, prefix="cmp_", after=after, limit=1000)
        yield from (f"d-{e.key}" for e in page)
        if len(page) < 1000:
            return
        after = page[-1].key


DELIVERIES = declare("campaigns", "deliveries", [DELIVERY], instances=_slot_tables)

CAMPAIGN_KEY = "cmp_"  # every campaign id starts with it (``domain.ID_RE``): the records' prefix
CAMPAIGN = RecordType(
    "campaign",
    CAMPAIGN_KEY,
    (
        ValueIndex("campaign_state", fields=("state",)),
        # The campaigns of a segment by state: deleting a segment asks which still need it.
        ValueIndex("campaign_segment", fields=("segment_id", "state")),
    ),
)
CAMPAIGNS = declare("campaigns", "campaigns", [CAMPAIGN])


def _filter_index(state: str | None, reason: str | None, contact_id: str | None) -> tuple[str, list[object]]:
    """Return the value index (and its leading values) whose entries hold the filtered slots, fewest first."""
    if contact_id is not None:
        return "delivery_contact", [contact_id]  # a contact has one slot per campaign (or a few)
    if state is not None and reason is not None:
        return "delivery_state_reason", [state, reason]
    if state is not None:
        return "delivery_state", [state]
    return "delivery_reason", [reason]


def _stale(exc: ConflictError, expected: int) -> Exception:
    if exc.current_version is None:
        return NotFound("campaign not found")
    return VersionConflict(
        f"campaign changed: expected version {expected}, found {exc.current_version}",
        current_version=exc.current_version,
    )


class KvCampaignStore:
    """``CampaignStore`` over a DurableKv; safe across threads and processes."""

    def __init__(self, kv: DurableKv) -> None:
        self.kv = kv
        self.tables = TenantKv(kv, "campaigns")
        self.layout: IndexedTable = CAMPAIGNS.layout(kv)

    def _campaigns(self, tenant: str) -> str:
        return self.tables.table(tenant, "campaigns")

    def campaign_get(self, tenant: str, campaign_id: str) -> Campaign | None:
        if not campaign_id.startswith(CAMPAIGN_KEY):
            return None  # not a campaign id (and never an index entry)
        entry = self.kv.get(self._campaigns(tenant), campaign_id)
        return Campaign.from_json(entry.value, entry.version) if entry else None

    def campaign_insert(self, tenant: str, campaign: Campaign) -> Campaign:
        value = campaign.to_json()
        try:
            (entry,) = self.layout.commit(
                self._campaigns(tenant),
                [Put(campaign.id, value, expect=ABSENT)],
                [RecordChange(CAMPAIGN, campaign.id, None, value)],
            )
        except ConflictError as exc:
            raise Conflict(f"campaign {campaign.id} exists", current_version=exc.current_version) from None
        assert entry is not None
        return replace(campaign, version=entry.version)

    def _current(self, tenant: str, campaign_id: str, expected_version: int) -> Any:
        """Return the stored value at ``expected_version`` (the old value of the index change)."""
        entry = self.kv.get(self._campaigns(tenant), campaign_id) if campaign_id.startswith(CAMPAIGN_KEY) else None
        if entry is None:
            raise NotFound("campaign not found")
        if entry.version != expected_version:
            raise VersionConflict(
                f"campaign changed: expected version {expected_version}, found {entry.version}",
                current_version=entry.version,
            )
        return entry.value

    def campaign_replace(self, tenant: str, campaign: Campaign, *, expected_version: int) -> Campaign:
        old, value = self._current(tenant, campaign.id, expected_version), campaign.to_json()
        try:
            (entry,) = self.layout.commit(
                self._campaigns(tenant),
                [Put(campaign.id, value, expect=expected_version)],
                [RecordChange(CAMPAIGN, campaign.id, old, value)],
            )
        except ConflictError as exc:
            raise _stale(exc, expected_version) from None
        assert entry is not None
        return replace(campaign, version=entry.version)

    def campaign_delete(self, tenant: str, campaign_id: str, *, expected_version: int) -> None:
        old = self._current(tenant, campaign_id, expected_version)
        try:
            self.layout.commit(
                self._campaigns(tenant),
                [Delete(campaign_id, expect=expected_version)],
                [RecordChange(CAMPAIGN, campaign_id, old, None)],
            )
        except ConflictError as exc:
            raise _stale(exc, expected_version) from None

    def campaign_scan(
        self,
        tenant: str,
        *,
        after: str | None = None,
        limit: int = 100,
        state: str | None = None,
    ) -> list[Campaign]:
        validate_scan_limit(limit)
        table = self._campaigns(tenant)
        if state is None:
            entries = self.kv.scan(table, prefix=CAMPAIGN_KEY, after=after, limit=limit)
            return [Campaign.from_json(e.value, e.version) for e in entries]
        cursor = f"{INDEX_ROOT}campaign_state/{encode([state])}{after}" if after is not None else None
        out: list[Campaign] = []
        while len(out) < limit:
            want = min(MAX_GET_MANY, limit - len(out))
            found = self.layout.scan(table, "campaign_state", [state], after=cursor, limit=want)
            out += [
                Campaign.from_json(e.value, e.version)
                for e in self.layout.fetch(table, found)
                if e is not None and e.value["state"] == state
            ]
            if len(found) < want:
                break
            cursor = found[-1].key
        return out

    def campaign_scan_by_segment(
        self, tenant: str, segment_id: str, *, states: Sequence[str], limit: int = 10
    ) -> list[Campaign]:
        validate_scan_limit(limit)
        table = self._campaigns(tenant)
        out: list[Campaign] = []
        for state in states:
            if len(out) >= limit:
                break
            found = self.layout.scan(table, "campaign_segment", [segment_id, state], limit=min(MAX_GET_MANY, limit))
            out += [
                Campaign.from_json(e.value, e.version)
                for e in self.layout.fetch(table, found)
                if e is not None and e.value["segment_id"] == segment_id and e.value["state"] == state
            ]
        return out[:limit]

    # --- the scheduler's index

    def _index(self) -> str:
        return self.tables.kernel_table(SYSTEM, "index")

    def index_upgrade(self, *, batch: int = COMMIT_BATCH) -> int:
        """Move the index entries an earlier version kept in ``campaigns/system/index``; return how many.

        Idempotent and resumable (a killed run leaves each entry in one table or
        both, and the next run finishes it); an entry the new table already
        has was written later, by this version, and wins.
        """
        legacy, moved = self.tables.reserved_table(SYSTEM, "index"), 0
        while entries := self.kv.scan(legacy, limit=batch):
            for e in entries:
                try:
                    self.kv.commit(self._index(), [Put(e.key, e.value, expect=ABSENT)])
                    moved += 1
                except ConflictError:
                    pass  # written by this version since: newer than the legacy entry
            for e in entries:
                try:
                    self.kv.commit(legacy, [Delete(e.key, expect=e.version)])
                except ConflictError:
                    # Rewritten by an older process meanwhile: the next pass deletes it
                    # (the tick re-reads the campaign).
                    pass
        return moved

    def index_put(self, tenant: str, campaign_id: str, *, state: str, at: int | None) -> None:
        self.tables.table(tenant, "campaigns")  # validates the tenant id
        self.kv.commit(self._index(), [Put(f"{tenant}{SEP}{campaign_id}", {"state": state, "at": at})])

    def index_delete(self, tenant: str, campaign_id: str) -> None:
        self.kv.commit(self._index(), [Delete(f"{tenant}{SEP}{campaign_id}")])

    def index_erase(self, tenant: str) -> int:
        """Delete every due-index entry of ``tenant`` (tenant erasure), in both tables; return how many."""
        validate_tenant_id(tenant, "tenant")
        removed = 0
        for table in (self._index(), self.tables.reserved_table(SYSTEM, "index")):
            while entries := self.kv.scan(table, prefix=f"{tenant}{SEP}", limit=COMMIT_BATCH):
                self.kv.commit(table, [Delete(e.key) for e in entries])
                removed += len(entries)
        return removed

    def index_scan(self, *, after: tuple[str, str] | None = None, limit: int = 500) -> list[IndexEntry]:
        validate_scan_limit(limit)
        if after is None:  # a tick's first page: pick up what processes of an earlier version wrote
            self.index_upgrade()
        entries = self.kv.scan(self._index(), after=f"{after[0]}{SEP}{after[1]}" if after else None, limit=limit)
        out = []
        for e in entries:
            tenant, _, campaign_id = e.key.partition(SEP)
            out.append(IndexEntry(tenant, campaign_id, e.value["state"], e.value.get("at")))
        return out

    # --- throttle

    def throttle_take(
        self, tenant: str, key: str, *, count: int, interval_ms: float, now_ms: int, not_before_ms: int | None = None
    ) -> int:
        table = self.tables.table(tenant, "throttle")

        def book() -> int:
            entry = self.kv.get(table, key)
            booked = float(entry.value["next_ms"]) if entry else 0.0
            start = max(float(now_ms), booked, float(not_before_ms or 0))
            value = {"next_ms": start + count * interval_ms}
            self.kv.commit(table, [Put(key, value, expect=entry.version if entry else ABSENT, ttl_ms=3_600_000)])
            return int(start)

        return cas_retry(book, what="the send throttle")


class KvSlotStore(SlotRules):
    """``SlotStore`` over a DurableKv; safe across threads and processes.

    Every slot write goes through ``DELIVERIES``' ``IndexedTable.commit`` with
    the slot's change (the value the commit's version expects → the new one),
    so the counters and value entries move in the slot's own commit.
    """

    def __init__(self, kv: DurableKv) -> None:
        self.kv = kv
        self.tables = TenantKv(kv, "campaigns")
        self.layout: IndexedTable = DELIVERIES.layout(kv)

    def _table(self, tenant: str, campaign_id: str) -> str:
        return self.tables.table(tenant, f"d-{campaign_id}")

    def slots_add(self, tenant: str, campaign_id: str, deliveries: Sequence[Delivery]) -> int:
        table = self._table(tenant, campaign_id)
        added = 0
        for start in range(0, len(deliveries), COMMIT_BATCH):
            pending = {d.recipient: d.to_json() for d in deliveries[start : start + COMMIT_BATCH]}
            while pending:
                ops: list[Op] = [Put(SLOT + r, value, expect=ABSENT) for r, value in pending.items()]
                changes = [RecordChange(DELIVERY, SLOT + r, None, value) for r, value in pending.items()]
                try:
                    self.layout.commit(table, ops, changes)
                    added += len(pending)
                    break
                except ConflictError as exc:
                    pending.pop(exc.key.removeprefix(SLOT), None)  # that recipient has a slot: keep it
        return added

    def slots_claim(self, tenant: str, campaign_id: str, claims: Sequence[tuple[str, Delivery]]) -> list[bool]:
        table = self._table(tenant, campaign_id)
        out: list[bool] = []
        for start in range(0, len(claims), CLAIM_BATCH):
            out += self._claim_batch(table, claims[start : start + CLAIM_BATCH])
        return out

    def _claim_batch(self, table: str, claims: Sequence[tuple[str, Delivery]]) -> list[bool]:
        # A miss: another planner claimed some of these meanwhile; cas_retry reads them again.
        return cas_retry(lambda: self._claim_round(table, claims), what="the campaign's plan")

    def _claim_round(self, table: str, claims: Sequence[tuple[str, Delivery]]) -> list[bool]:
        found = self.kv.get_many(table, [PLAN + k for k, _ in claims] + [SLOT + d.recipient for _, d in claims])
        owners: dict[str, str] = {}  # recipient key or slot key → the contact that has it
        ops: list[Op] = []
        changes: list[RecordChange] = []
        granted: list[bool] = []
        for (key, d), plan, slot in zip(claims, found[: len(claims)], found[len(claims) :], strict=True):
            if key not in owners and SLOT + d.recipient not in owners:
                if plan is not None:
                    owners[key] = str(plan.value["contact"])
                elif slot is not None:  # planned before plan records were kept (or by slots_add)
                    owners[key] = str(slot.value["contact_id"])
                    ops.append(Put(PLAN + key, {"contact": owners[key]}, expect=ABSENT))
                else:
                    owners[key] = owners[SLOT + d.recipient] = d.contact_id
                    value = d.to_json()
                    ops += [
                        Put(PLAN + key, {"contact": d.contact_id}, expect=ABSENT),
                        Put(SLOT + d.recipient, value, expect=ABSENT),
                    ]
                    changes.append(RecordChange(DELIVERY, SLOT + d.recipient, None, value))
            granted.append(owners.get(key, owners.get(SLOT + d.recipient)) == d.contact_id)
        if ops:
            self.layout.commit(table, ops, changes)
        return granted

    def slot_get(self, tenant: str, campaign_id: str, recipient: str) -> Delivery | None:
        entry = self.kv.get(self._table(tenant, campaign_id), SLOT + recipient)
        return Delivery.from_json(entry.value, entry.version) if entry else None

    def slot_scan(
        self,
        tenant: str,
        campaign_id: str,
        *,
        after: str | None = None,
        limit: int = 100,
        state: str | None = None,
        reason: str | None = None,
        contact_id: str | None = None,
    ) -> list[Delivery]:
        validate_scan_limit(limit)
        table = self._table(tenant, campaign_id)
        if state is None and reason is None and contact_id is None:
            entries = self.kv.scan(table, prefix=SLOT, after=SLOT + after if after is not None else None, limit=limit)
            return [Delivery.from_json(e.value, e.version) for e in entries]
        index, values = _filter_index(state, reason, contact_id)
        # An entry's key is x/<index>/<encoded values><primary key>: the cursor recipient's entry.
        cursor = f"{INDEX_ROOT}{index}/{encode(values)}{SLOT}{after}" if after is not None else None
        out: list[Delivery] = []
        while True:
            want = min(MAX_GET_MANY, limit - len(out) + 1)
            entries = self.layout.scan(table, index, values, after=cursor, limit=want)
            for record in self.layout.fetch(table, entries):
                if record is None:
                    continue  # deleted since the scan
                d = Delivery.from_json(record.value, record.version)
                if slot_matches(d, state=state, reason=reason, contact_id=contact_id):
                    out.append(d)
                    if len(out) == limit:
                        return out
            if len(entries) < want:
                return out
            cursor = entries[-1].key

    def slot_counts(self, tenant: str, campaign_id: str) -> DeliveryCounts:
        table = self._table(tenant, campaign_id)
        states: dict[str, int] = {}
        for group, n in self.layout.count_prefix(table, "delivery_count_state").items():
            if n:
                states[str(decode(group)[0])] = n
        reasons: dict[str, int] = {}
        for group, n in self.layout.count_prefix(table, "delivery_count_reason", limit=MAX_REASONS).items():
            if n:
                state, reason = decode(group)
                reasons[f"{state}:{reason}"] = n
        return DeliveryCounts(sum(states.values()), dict(sorted(states.items())), dict(sorted(reasons.items())))

    def _apply(self, tenant: str, campaign_id: str, items: Sequence[tuple[Delivery | str, Change]]) -> list[Delivery]:
        table = self._table(tenant, campaign_id)
        work: list[tuple[Delivery | None, Change]] = []
        for slot, change in items:
            work.append((self.slot_get(tenant, campaign_id, slot) if isinstance(slot, str) else slot, change))
        results: dict[str, Delivery] = {}
        for start in range(0, len(work), COMMIT_BATCH):
            self._apply_batch(tenant, campaign_id, table, work[start : start + COMMIT_BATCH], results)
        order = [(s if isinstance(s, str) else s.recipient) for s, _ in items]
        return [results[r] for r in order if r in results]

    def _apply_batch(
        self,
        tenant: str,
        campaign_id: str,
        table: str,
        work: list[tuple[Delivery | None, Change]],
        results: dict[str, Delivery],
    ) -> None:
        current = {d.recipient: (d, change) for d, change in work if d is not None}

        def attempt() -> None:
            planned: dict[str, tuple[Delivery, Delivery]] = {}
            for recipient, (d, change) in current.items():
                changed = change(d)
                if changed is not None:
                    planned[recipient] = (d, changed)
            if not planned:
                return
            ops: list[Op] = []
            changes: list[RecordChange] = []
            for r, (old, new) in planned.items():
                value = new.to_json()
                ops.append(Put(SLOT + r, value, expect=old.version))
                # The slot as the caller read it is the value at the version this commit expects.
                changes.append(RecordChange(DELIVERY, SLOT + r, old.to_json(), value))
            try:
                written = self.layout.commit(table, ops, changes)
            except ConflictError as exc:
                # Someone changed a slot since it was read (likely more than one: another sender works
                # through the same page): re-read the batch, and the retry applies the rules to what is there now.
                stale = [exc.key.removeprefix(SLOT)] + [r for r in planned if r != exc.key.removeprefix(SLOT)]
                for recipient, entry in zip(stale, self.kv.get_many(table, [SLOT + r for r in stale]), strict=True):
                    if entry is None:
                        current.pop(recipient, None)
                    elif entry.version != current[recipient][0].version:
                        current[recipient] = (Delivery.from_json(entry.value, entry.version), current[recipient][1])
                raise
            for (recipient, (_, n)), entry in zip(planned.items(), written, strict=True):
                assert entry is not None
                results[recipient] = replace(n, version=entry.version)

        # A round per slot another sender may change under us, at most: the batch's size on top of the limit.
        cas_retry(attempt, what="the campaign's slots", attempts=CAS_ATTEMPTS + len(current))

    def slots_drop_all(self, tenant: str, campaign_id: str) -> None:
        self.kv.drop(self._table(tenant, campaign_id))


on_tenant_erase("campaigns due-index entries", lambda kv, tenant: KvCampaignStore(kv).index_erase(tenant))
