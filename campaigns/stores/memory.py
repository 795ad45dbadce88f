"""The reference campaign stores: plain dicts under one lock (one process)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace

from botmesh_admin.errors import Conflict, NotFound
from campaigns.domain import Campaign, Delivery, DeliveryCounts, count_deliveries

from .base import Change, IndexEntry, SlotRules, VersionConflict, slot_matches, validate_scan_limit


class MemoryCampaignStore:
    """``CampaignStore`` in memory."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._campaigns: dict[tuple[str, str], Campaign] = {}
        self._index: dict[tuple[str, str], IndexEntry] = {}
        self._throttle: dict[tuple[str, str], float] = {}

    def campaign_get(self, tenant: str, campaign_id: str) -> Campaign | None:
        with self._lock:
            return self._campaigns.get((tenant, campaign_id))

    def campaign_insert(self, tenant: str, campaign: Campaign) -> Campaign:
        with self._lock:
            if (tenant, campaign.id) in self._campaigns:
                raise Conflict(
                    f"campaign {campaign.id} exists", current_version=self._campaigns[(tenant, campaign.id)].version
                )
            stored = replace(campaign, version=1)
            self._campaigns[(tenant, campaign.id)] = stored
            return stored

    def campaign_replace(self, tenant: str, campaign: Campaign, *, expected_version: int) -> Campaign:
        with self._lock:
            current = self._campaigns.get((tenant, campaign.id))
            if current is None:
                raise NotFound(f"campaign {campaign.id} not found")
            if current.version != expected_version:
                raise VersionConflict(
                    f"campaign changed: expected version {expected_version}, found {current.version}",
                    current_version=current.version,
                )
            stored = replace(campaign, version=current.version + 1)
            self._campaigns[(tenant, campaign.id)] = stored
            return stored

    def campaign_delete(self, tenant: str, campaign_id: str, *, expected_version: int) -> None:
        with self._lock:
            current = self._campaigns.get((tenant, campaign_id))
            if current is None:
                raise NotFound(f"campaign {campaign_id} not found")
            if current.version != expected_version:
                raise VersionConflict("campaign changed", current_version=current.version)
            del self._campaigns[(tenant, campaign_id)]

    def campaign_scan(
        self,
        tenant: str,
        *,
        after: str | None = None,
        limit: int = 100,
        state: str | None = None,
    ) -> list[Campaign]:
        validate_scan_limit(limit)
        with self._lock:
            ids = sorted(cid for (t, cid) in self._campaigns if t == tenant and (after is None or cid > after))
            found = [self._campaigns[(tenant, cid)] for cid in ids]
            return [c for c in found if state is None or c.state == state][:limit]

    def campaign_scan_by_segment(
        self, tenant: str, segment_id: str, *, states: Sequence[str], limit: int = 10
    ) -> list[Campaign]:
        validate_scan_limit(limit)
        with self._lock:
            found = [c for (t, _), c in sorted(self._campaigns.items()) if t == tenant and c.segment_id == segment_id]
        return [c for state in states for c in found if c.state == state][:limit]

    def index_put(self, tenant: str, campaign_id: str, *, state: str, at: int | None) -> None:
        with self._lock:
            self._index[(tenant, campaign_id)] = IndexEntry(tenant, campaign_id, state, at)

    def index_delete(self, tenant: str, campaign_id: str) -> None:
        with self._lock:
            self._index.pop((tenant, campaign_id), None)

    def index_scan(self, *, after: tuple[str, str] | None = None, limit: int = 500) -> list[IndexEntry]:
        validate_scan_limit(limit)
        with self._lock:
            keys = sorted(k for k in self._index if after is None or k > after)
            return [self._index[k] for k in keys[:limit]]

    def throttle_take(
        self, tenant: str, key: str, *, count: int, interval_ms: float, now_ms: int, not_before_ms: int | None = None
    ) -> int:
        with self._lock:
            next_free = max(float(now_ms), self._throttle.get((tenant, key), 0.0), float(not_before_ms or 0))
            self._throttle[(tenant, key)] = next_free + count * interval_ms
            return int(next_free)


class MemorySlotStore(SlotRules):
    """``SlotStore`` in memory."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: dict[tuple[str, str], dict[str, Delivery]] = {}
        self._claims: dict[tuple[str, str], dict[str, str]] = {}

    def _table(self, tenant: str, campaign_id: str) -> dict[str, Delivery]:
        return self._slots.setdefault((tenant, campaign_id), {})

    def slots_add(self, tenant: str, campaign_id: str, deliveries: Sequence[Delivery]) -> int:
        added = 0
        with self._lock:
            table = self._table(tenant, campaign_id)
            for d in deliveries:
                if d.recipient not in table:
                    table[d.recipient] = replace(d, version=1)
                    added += 1
        return added

    def slots_claim(self, tenant: str, campaign_id: str, claims: Sequence[tuple[str, Delivery]]) -> list[bool]:
        granted: list[bool] = []
        with self._lock:
            table = self._table(tenant, campaign_id)
            owners = self._claims.setdefault((tenant, campaign_id), {})
            for key, d in claims:
                if key not in owners:
                    held = table.get(d.recipient)
                    owners[key] = held.contact_id if held is not None else d.contact_id
                    if held is None:
                        table[d.recipient] = replace(d, version=1)
                granted.append(owners[key] == d.contact_id)
        return granted

    def slot_get(self, tenant: str, campaign_id: str, recipient: str) -> Delivery | None:
        with self._lock:
            return self._slots.get((tenant, campaign_id), {}).get(recipient)

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
        with self._lock:
            table = self._slots.get((tenant, campaign_id), {})
            keys = sorted(k for k in table if after is None or k > after)  # code point order = UTF-8 byte order
            found = (table[k] for k in keys)
            page = [d for d in found if slot_matches(d, state=state, reason=reason, contact_id=contact_id)]
            return page[:limit]

    def slot_counts(self, tenant: str, campaign_id: str) -> DeliveryCounts:
        with self._lock:
            return count_deliveries(list(self._slots.get((tenant, campaign_id), {}).values()))

    def _apply(self, tenant: str, campaign_id: str, items: Sequence[tuple[Delivery | str, Change]]) -> list[Delivery]:
        out: list[Delivery] = []
        with self._lock:
            table = self._slots.get((tenant, campaign_id), {})
            for slot, change in items:
                recipient = slot if isinstance(slot, str) else slot.recipient
                current = table.get(recipient)
                if current is None:
                    continue
                changed = change(current)
                if changed is None:
                    continue
                stored = replace(changed, version=current.version + 1)
                table[recipient] = stored
                out.append(stored)
        return out

    def slots_drop_all(self, tenant: str, campaign_id: str) -> None:
        with self._lock:
            self._slots.pop((tenant, campaign_id), None)
            self._claims.pop((tenant, campaign_id), None)
