"""MemoryDeploymentStore: the reference deployment store, in one process's memory."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from deployments.domain import ActivePointer, AuditEvent, BotVersion

from .base import AuditFor, IndexEntry, StaleRevision


@dataclass
class _Bot:
    next_seq: int = 1
    versions: dict[int, BotVersion] = field(default_factory=dict)  # seq -> version (with revision)
    index: dict[str, IndexEntry] = field(default_factory=dict)
    active: ActivePointer | None = None
    active_revision: int = 0
    audit_ids: list[str] = field(default_factory=list)  # sorted; ids sort newest first
    audit: dict[str, AuditEvent] = field(default_factory=dict)


class MemoryDeploymentStore:
    """Deployment store in dicts behind one lock; revisions grow by one per write."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tenants: dict[str, dict[str, _Bot]] = {}

    def _bot(self, tenant: str, bot: str) -> _Bot:
        return self._tenants.setdefault(tenant, {}).setdefault(bot, _Bot())

    def _peek(self, tenant: str, bot: str) -> _Bot | None:
        return self._tenants.get(tenant, {}).get(bot)

    @staticmethod
    def _add_audit(b: _Bot, audit: Sequence[AuditEvent]) -> None:
        for event in audit:
            bisect.insort(b.audit_ids, event.id)
            b.audit[event.id] = event

    def publish(self, tenant: str, version: BotVersion, *, audit: AuditFor) -> BotVersion:
        """Assign the next seq and store the version (see the contract)."""
        with self._lock:
            b = self._bot(tenant, version.bot)
            if version.version in b.index:
                raise StaleRevision(f"version {version.version!r} of {version.bot!r} is already published")
            seq = b.next_seq
            stored = replace(version, seq=seq, revision=1)
            b.next_seq += 1
            b.versions[seq] = stored
            b.index[version.version] = IndexEntry(seq=seq, digest=stored.digest)
            self._add_audit(b, audit(stored))
            return stored

    def index_get(self, tenant: str, bot: str, version: str) -> IndexEntry | None:
        """Return the index entry of ``version``."""
        with self._lock:
            b = self._peek(tenant, bot)
            return b.index.get(version) if b else None

    def get_version(self, tenant: str, bot: str, version: str) -> BotVersion | None:
        """Return the retained version or ``None``."""
        with self._lock:
            b = self._peek(tenant, bot)
            index = b.index.get(version) if b else None
            return b.versions.get(index.seq) if b and index else None

    def list_versions(
        self, tenant: str, bot: str, *, limit: int = 50, after_seq: int | None = None
    ) -> list[BotVersion]:
        """Return retained versions by descending seq."""
        with self._lock:
            b = self._peek(tenant, bot)
            if b is None:
                return []
            seqs = sorted((s for s in b.versions if after_seq is None or s < after_seq), reverse=True)
            return [b.versions[s] for s in seqs[:limit]]

    def update_version(
        self,
        tenant: str,
        version: BotVersion,
        *,
        expect_revision: int,
        audit: Sequence[AuditEvent] = (),
    ) -> BotVersion:
        """Compare-and-set the version record."""
        with self._lock:
            b = self._bot(tenant, version.bot)
            current = b.versions.get(version.seq)
            if current is None or current.revision != expect_revision:
                raise StaleRevision(
                    f"version {version.version!r} changed concurrently",
                    current_version=current.revision if current else None,
                )
            stored = replace(version, revision=current.revision + 1)
            b.versions[version.seq] = stored
            self._add_audit(b, audit)
            return stored

    def get_active(self, tenant: str, bot: str) -> ActivePointer | None:
        """Return the active pointer or ``None``."""
        with self._lock:
            b = self._peek(tenant, bot)
            return b.active if b else None

    def set_active(
        self,
        tenant: str,
        pointer: ActivePointer,
        *,
        expect_revision: int | None,
        version: BotVersion,
        audit: Sequence[AuditEvent] = (),
    ) -> ActivePointer:
        """Compare-and-set the active pointer, guarded by the version's revision."""
        with self._lock:
            b = self._bot(tenant, pointer.bot)
            current = b.active.revision if b.active else None
            if current != expect_revision:
                raise StaleRevision(
                    f"the active deployment of {pointer.bot!r} changed concurrently",
                    current_version=current,
                )
            stored_version = b.versions.get(version.seq)
            if stored_version is None or stored_version.revision != version.revision:
                raise StaleRevision(
                    f"version {version.version!r} changed concurrently",
                    current_version=stored_version.revision if stored_version else None,
                )
            b.active_revision += 1
            b.active = replace(pointer, revision=b.active_revision)
            self._add_audit(b, audit)
            return b.active

    def delete_versions(
        self,
        tenant: str,
        bot: str,
        victims: Sequence[BotVersion],
        *,
        active_revision: int | None,
        audit: Sequence[AuditEvent] = (),
    ) -> None:
        """Delete ``victims`` and tombstone their index entries atomically."""
        with self._lock:
            b = self._bot(tenant, bot)
            current = b.active.revision if b.active else None
            if current != active_revision:
                raise StaleRevision(
                    f"the active deployment of {bot!r} changed concurrently",
                    current_version=current,
                )
            for v in victims:
                stored = b.versions.get(v.seq)
                if stored is None or stored.revision != v.revision:
                    raise StaleRevision(
                        f"version {v.version!r} changed concurrently",
                        current_version=stored.revision if stored else None,
                    )
            for v in victims:
                del b.versions[v.seq]
                b.index[v.version] = IndexEntry(seq=v.seq, digest=v.digest, pruned=True)
            self._add_audit(b, audit)

    def list_active(self, tenant: str, *, limit: int = 50, after: str | None = None) -> list[ActivePointer]:
        """Return the active pointers by bot id after ``after``."""
        with self._lock:
            bots = self._tenants.get(tenant, {})
            live = sorted(
                (n, b.active) for n, b in bots.items() if b.active is not None and (after is None or n > after)
            )
            return [pointer for _, pointer in live[:limit]]

    def count_active(self, tenant: str) -> int:
        """Count the bots with an active pointer (the reference: a walk)."""
        with self._lock:
            return sum(1 for b in self._tenants.get(tenant, {}).values() if b.active is not None)

    def list_bots(self, tenant: str, *, limit: int = 50, after: str | None = None) -> list[str]:
        """Return bot ids that have published."""
        with self._lock:
            bots = self._tenants.get(tenant, {})
            names = sorted(n for n, b in bots.items() if b.next_seq > 1 and (after is None or n > after))
            return names[:limit]

    def audit_list(self, tenant: str, bot: str, *, limit: int = 50, after: str | None = None) -> list[AuditEvent]:
        """Return the bot's audit events newest first."""
        with self._lock:
            b = self._peek(tenant, bot)
            if b is None:
                return []
            start = 0 if after is None else bisect.bisect_right(b.audit_ids, after)
            return [b.audit[i] for i in b.audit_ids[start : start + limit]]

    def drop_tenant(self, tenant: str) -> None:
        """Forget everything of ``tenant``."""
        with self._lock:
            self._tenants.pop(tenant, None)
