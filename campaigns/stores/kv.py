"""The campaign stores over any DurableKv (ARCHITECTURE §4), through ``TenantKv(kv, "campaigns")``.

Layout:

- ``campaigns/<tenant>/campaigns``: ``<campaign id>`` → campaign JSON.
- ``campaigns/<tenant>/d-<campaign id>``: ``d/<recipient>`` → the recipient's send
  slot, ``m/runner`` → the runner lease ``{"owner", "until"}``. One table per
  campaign, so a batch of slot changes is one atomic commit and deleting a
  campaign drops one table.
- ``campaigns/<tenant>/throttle``: ``<channel>`` → ``{"next_ms"}`` (booked send times).
- ``campaigns/system/index``: ``<tenant>!<campaign id>`` → ``{"state", "at"}``, the
  active campaigns the scheduler's tick reads (the one cross-tenant table; it
  holds ids only; ``!`` sorts before every id character, so keys sort as (tenant, id) pairs).

Versions are the Kv entry versions. Slot changes are compare-and-set on the
version the caller read; on a conflict the slot is read again and the rule
re-applied to what is there now.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from botmesh_admin.errors import Conflict, NotFound
from botmesh_admin.kv import ABSENT, ConflictError, Delete, DurableKv, Put, TenantKv
from campaigns.domain import (
    Campaign,
    Delivery,
    DeliveryCounts,
    campaign_from_json,
    campaign_to_json,
    count_deliveries,
    delivery_from_json,
    delivery_to_json,
)

from .base import MAX_SCAN, Change, IndexEntry, SlotRules, check_scan_limit

SYSTEM = "system"
SLOT = "d/"
LEASE = "m/runner"
SEP = "!"
COMMIT_BATCH = 500
MAX_ROUNDS = 50


def _stale(exc: ConflictError, expected: int) -> Exception:
    if exc.current_version is None:
        return NotFound("campaign not found")
    return Conflict(
        f"campaign changed: expected version {expected}, found {exc.current_version}",
        current_version=exc.current_version,
    )


class KvCampaignStore:
    """``CampaignStore`` over a DurableKv; safe across threads and processes."""

    def __init__(self, kv: DurableKv) -> None:
        self.kv = kv
        self.tables = TenantKv(kv, "campaigns")

    def _campaigns(self, tenant: str) -> str:
        return self.tables.table(tenant, "campaigns")

    def campaign_get(self, tenant: str, campaign_id: str) -> Campaign | None:
        entry = self.kv.get(self._campaigns(tenant), campaign_id)
        return campaign_from_json(entry.value, entry.version) if entry else None

    def campaign_insert(self, tenant: str, campaign: Campaign) -> Campaign:
        try:
            (entry,) = self.kv.commit(
                self._campaigns(tenant), [Put(campaign.id, campaign_to_json(campaign), expect=ABSENT)]
            )
        except ConflictError as exc:
            raise Conflict(f"campaign {campaign.id} exists", current_version=exc.current_version) from None
        assert entry is not None
        return replace(campaign, version=entry.version)

    def campaign_replace(self, tenant: str, campaign: Campaign, *, expected_version: int) -> Campaign:
        try:
            (entry,) = self.kv.commit(
                self._campaigns(tenant), [Put(campaign.id, campaign_to_json(campaign), expect=expected_version)]
            )
        except ConflictError as exc:
            raise _stale(exc, expected_version) from None
        assert entry is not None
        return replace(campaign, version=entry.version)

    def campaign_delete(self, tenant: str, campaign_id: str, *, expected_version: int) -> None:
        try:
            self.kv.commit(self._campaigns(tenant), [Delete(campaign_id, expect=expected_version)])
        except ConflictError as exc:
            raise _stale(exc, expected_version) from None

    def campaign_scan(self, tenant: str, *, after: str | None = None, limit: int = 100) -> list[Campaign]:
        check_scan_limit(limit)
        return [campaign_from_json(e.value, e.version) for e in
                self.kv.scan(self._campaigns(tenant), after=after, limit=limit)]

    # --- the scheduler's index

    def _index(self) -> str:
        return self.tables.table(SYSTEM, "index")

    def index_put(self, tenant: str, campaign_id: str, *, state: str, at: int | None) -> None:
        self.tables.table(tenant, "campaigns")  # validates the tenant id
        self.kv.commit(self._index(), [Put(f"{tenant}{SEP}{campaign_id}", {"state": state, "at": at})])

    def index_delete(self, tenant: str, campaign_id: str) -> None:
        self.kv.commit(self._index(), [Delete(f"{tenant}{SEP}{campaign_id}")])

    def index_scan(self, *, after: tuple[str, str] | None = None, limit: int = 500) -> list[IndexEntry]:
        check_scan_limit(limit)
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
        for _ in range(200):
            entry = self.kv.get(table, key)
            booked = float(entry.value["next_ms"]) if entry else 0.0
            start = max(float(now_ms), booked, float(not_before_ms or 0))
            value = {"next_ms": start + count * interval_ms}
            try:
                self.kv.commit(table, [Put(key, value, expect=entry.version if entry else ABSENT,
                                           ttl_ms=3_600_000)])
                return int(start)
            except ConflictError:
                continue
        raise Conflict("the send throttle is too busy; try again")


class KvSlotStore(SlotRules):
    """``SlotStore`` over a DurableKv; safe across threads and processes."""

    def __init__(self, kv: DurableKv) -> None:
        self.kv = kv
        self.tables = TenantKv(kv, "campaigns")

    def _table(self, tenant: str, campaign_id: str) -> str:
        return self.tables.table(tenant, f"d-{campaign_id}")

    def slots_add(self, tenant: str, campaign_id: str, deliveries: Sequence[Delivery]) -> int:
        table = self._table(tenant, campaign_id)
        added = 0
        for start in range(0, len(deliveries), COMMIT_BATCH):
            pending = {d.recipient: d for d in deliveries[start:start + COMMIT_BATCH]}
            while pending:
                ops = [Put(SLOT + r, delivery_to_json(d), expect=ABSENT) for r, d in pending.items()]
                try:
                    self.kv.commit(table, ops)
                    added += len(pending)
                    break
                except ConflictError as exc:
                    pending.pop(exc.key.removeprefix(SLOT), None)  # that recipient has a slot: keep it
        return added

    def slot_get(self, tenant: str, campaign_id: str, recipient: str) -> Delivery | None:
        entry = self.kv.get(self._table(tenant, campaign_id), SLOT + recipient)
        return delivery_from_json(entry.value, entry.version) if entry else None

    def slot_scan(
        self, tenant: str, campaign_id: str, *, after: str | None = None, limit: int = 100
    ) -> list[Delivery]:
        check_scan_limit(limit)
        entries = self.kv.scan(
            self._table(tenant, campaign_id), prefix=SLOT, after=SLOT + after if after is not None else None,
            limit=limit,
        )
        return [delivery_from_json(e.value, e.version) for e in entries]

    def slot_counts(self, tenant: str, campaign_id: str) -> DeliveryCounts:
        def every() -> list[Delivery]:
            out: list[Delivery] = []
            after = None
            while True:
                page = self.slot_scan(tenant, campaign_id, after=after, limit=MAX_SCAN)
                out.extend(page)
                if len(page) < MAX_SCAN:
                    return out
                after = page[-1].recipient

        return count_deliveries(every())

    def _apply(self, tenant: str, campaign_id: str, items: Sequence[tuple[Delivery | str, Change]]) -> list[Delivery]:
        table = self._table(tenant, campaign_id)
        work: list[tuple[Delivery | None, Change]] = []
        for slot, change in items:
            work.append((self.slot_get(tenant, campaign_id, slot) if isinstance(slot, str) else slot, change))
        results: dict[str, Delivery] = {}
        for start in range(0, len(work), COMMIT_BATCH):
            self._apply_batch(tenant, campaign_id, table, work[start:start + COMMIT_BATCH], results)
        order = [(s if isinstance(s, str) else s.recipient) for s, _ in items]
        return [results[r] for r in order if r in results]

    def _apply_batch(
        self, tenant: str, campaign_id: str, table: str, work: list[tuple[Delivery | None, Change]],
        results: dict[str, Delivery],
    ) -> None:
        current = {d.recipient: (d, change) for d, change in work if d is not None}
        for _ in range(MAX_ROUNDS + len(current)):
            planned: dict[str, tuple[Delivery, int]] = {}
            for recipient, (d, change) in current.items():
                changed = change(d)
                if changed is not None:
                    planned[recipient] = (changed, d.version)
            if not planned:
                return
            ops = [Put(SLOT + r, delivery_to_json(n), expect=v) for r, (n, v) in planned.items()]
            try:
                written = self.kv.commit(table, ops)
            except ConflictError as exc:
                # Someone changed a slot since it was read (likely more than one: another sender works
                # through the same page): re-read the batch and apply the rules to what is there now.
                stale = [exc.key.removeprefix(SLOT)] + [r for r in planned if r != exc.key.removeprefix(SLOT)]
                for recipient in stale:
                    fresh = self.slot_get(tenant, campaign_id, recipient)
                    if fresh is None:
                        current.pop(recipient, None)
                    elif fresh.version != current[recipient][0].version:
                        current[recipient] = (fresh, current[recipient][1])
                continue
            for (recipient, (n, _)), entry in zip(planned.items(), written, strict=True):
                assert entry is not None
                results[recipient] = replace(n, version=entry.version)
            return
        raise Conflict("the campaign's slots are changing too fast; try again")

    def slots_drop_all(self, tenant: str, campaign_id: str) -> None:
        self.kv.drop(self._table(tenant, campaign_id))

    # --- runner lease

    def lease_acquire(self, tenant: str, campaign_id: str, *, owner: str, ttl_ms: int, now_ms: int) -> bool:
        table = self._table(tenant, campaign_id)
        entry = self.kv.get(table, LEASE)
        if entry is not None and entry.value["owner"] != owner and entry.value["until"] > now_ms:
            return False
        try:
            self.kv.commit(table, [Put(LEASE, {"owner": owner, "until": now_ms + ttl_ms},
                                       expect=entry.version if entry else ABSENT)])
        except ConflictError:
            return False
        return True

    def lease_release(self, tenant: str, campaign_id: str, *, owner: str) -> None:
        table = self._table(tenant, campaign_id)
        entry = self.kv.get(table, LEASE)
        if entry is not None and entry.value["owner"] == owner:
            try:
                self.kv.commit(table, [Delete(LEASE, expect=entry.version)])
            except ConflictError:
                pass  # someone took it over meanwhile: theirs now

    def lease_holder(self, tenant: str, campaign_id: str, *, now_ms: int) -> str | None:
        entry = self.kv.get(self._table(tenant, campaign_id), LEASE)
        if entry is None or entry.value["until"] <= now_ms:
            return None
        return str(entry.value["owner"])
