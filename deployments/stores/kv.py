"""KvDeploymentStore: the deployment store over any DurableKv.

One table per tenant (``deployments/<tenant>/registry``), so every write and its
audit events commit in one atomic batch. Keys:

- ``bot/<bot>`` — ``{"next_seq": n}``, the per-bot sequence counter;
- ``version/<bot>/<10**10 - seq>`` — a retained version (descending seq in key order);
- ``version-index/<bot>/<version>`` — ``{"seq", "digest", "pruned"}`` for every version string;
- ``active/<bot>`` — the active pointer;
- ``audit/<bot>/<audit id>`` — audit events (ids sort newest first);
- ``x/…`` — the count index ``live`` (bots with an active pointer), kept in each
  activation's commit by ``botmesh_admin.kv.indexes``.

Entry versions are the records' revisions. Every page reads one ``scan`` of a
page (bots, a bot's versions newest first, its audit trail, the live bots
under ``active/``); the overview's count of live bots is one counter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from botmesh_admin.kv import (
    ABSENT,
    Check,
    ConflictError,
    Delete,
    DurableKv,
    Entry,
    Op,
    Put,
    TenantKv,
)
from botmesh_admin.kv.cas import cas_retry
from botmesh_admin.kv.indexes import CountIndex, RecordChange, RecordType, declare
from deployments.domain import ActivePointer, AuditEvent, BotVersion

from .base import AuditFor, IndexEntry, StaleRevision

COLLECTION = "registry"
SEQ_SPAN = 10**10
# ``reuses_keys`` (the default): the kernel reads the stored pointer for ``old``.
ACTIVE = RecordType("active", "active/", (CountIndex("live"),))
REGISTRY = declare("deployments", COLLECTION, [ACTIVE])
PUBLISH_ATTEMPTS = (
    50  # every concurrent publish of a bot races for its one seq counter: 8 lose under a burst of CI runs
)


def version_key(bot: str, seq: int) -> str:
    """Return the key of version number ``seq`` of ``bot`` (newest sorts first)."""
    return f"version/{bot}/{SEQ_SPAN - seq:010d}"


def _audit_ops(audit: Sequence[AuditEvent]) -> list[Op]:
    return [Put(f"audit/{e.bot}/{e.id}", e.to_json(), expect=ABSENT) for e in audit]


class KvDeploymentStore:
    """Deployment store over ``kv`` (see the module docstring for the key layout)."""

    def __init__(self, kv: DurableKv) -> None:
        self.kv = kv
        self.tables = TenantKv(kv, "deployments")
        self.layout = REGISTRY.layout(kv)

    def _table(self, tenant: str) -> str:
        return self.tables.table(tenant, COLLECTION)

    def _commit(
        self, tenant: str, ops: list[Op], what: str, changes: Sequence[RecordChange] = ()
    ) -> list[Entry | None]:
        try:
            return self.layout.commit(self._table(tenant), ops, changes)
        except ConflictError as exc:
            raise StaleRevision(f"{what} changed concurrently", current_version=exc.current_version) from None

    def publish(self, tenant: str, version: BotVersion, *, audit: AuditFor) -> BotVersion:
        """Assign the next seq and store the version, its index entry and audit (see the contract).

        Raise ``StaleRevision`` if the version string is taken, or ("too many concurrent
        publishes") after ``PUBLISH_ATTEMPTS`` lost races for the seq counter.
        """
        table, bot = self._table(tenant), version.bot
        counter_key, index_key = f"bot/{bot}", f"version-index/{bot}/{version.version}"

        def attempt() -> BotVersion:
            counter = self.kv.get(table, counter_key)
            seq = counter.value["next_seq"] if counter else 1
            stored = replace(version, seq=seq)
            ops: list[Op] = [
                Put(counter_key, {"next_seq": seq + 1}, expect=counter.version if counter else ABSENT),
                Put(index_key, {"seq": seq, "digest": stored.digest, "pruned": False}, expect=ABSENT),
                Put(version_key(bot, seq), stored.to_json(), expect=ABSENT),
                *_audit_ops(audit(stored)),
            ]
            try:
                written = self.kv.commit(table, ops)
            except ConflictError as exc:
                if exc.key == counter_key:
                    raise  # another publish took this seq: cas_retry takes the next one
                raise StaleRevision(
                    f"version {version.version!r} of {bot!r} is already published",
                    current_version=exc.current_version,
                ) from None
            entry = written[2]
            assert entry is not None  # a Put returns the written entry
            return replace(stored, revision=entry.version)

        return cas_retry(
            attempt,
            what=f"publishes of {bot!r}",
            attempts=PUBLISH_ATTEMPTS,
            # A StaleRevision (the counter moved under us): the service's own retry publishes again, as before.
            exhausted=lambda: StaleRevision(f"too many concurrent publishes for {bot!r}; try again"),
        )

    def index_get(self, tenant: str, bot: str, version: str) -> IndexEntry | None:
        """Return the index entry of ``version``."""
        entry = self.kv.get(self._table(tenant), f"version-index/{bot}/{version}")
        return IndexEntry(**entry.value) if entry else None

    def get_version(self, tenant: str, bot: str, version: str) -> BotVersion | None:
        """Return the retained version or ``None``."""
        index = self.index_get(tenant, bot, version)
        if index is None or index.pruned:
            return None
        entry = self.kv.get(self._table(tenant), version_key(bot, index.seq))
        return BotVersion.from_json(entry.value, entry.version) if entry else None

    def list_versions(
        self, tenant: str, bot: str, *, limit: int = 50, after_seq: int | None = None
    ) -> list[BotVersion]:
        """Return retained versions by descending seq."""
        after = version_key(bot, after_seq) if after_seq is not None else None
        entries = self.kv.scan(self._table(tenant), prefix=f"version/{bot}/", after=after, limit=limit)
        return [BotVersion.from_json(e.value, e.version) for e in entries]

    def update_version(
        self,
        tenant: str,
        version: BotVersion,
        *,
        expect_revision: int,
        audit: Sequence[AuditEvent] = (),
    ) -> BotVersion:
        """Compare-and-set the version record."""
        ops: list[Op] = [
            Put(version_key(version.bot, version.seq), version.to_json(), expect=expect_revision),
            *_audit_ops(audit),
        ]
        entry = self._commit(tenant, ops, f"version {version.version!r}")[0]
        assert entry is not None
        return replace(version, revision=entry.version)

    def get_active(self, tenant: str, bot: str) -> ActivePointer | None:
        """Return the active pointer or ``None``."""
        entry = self.kv.get(self._table(tenant), f"active/{bot}")
        return ActivePointer.from_json(entry.value, entry.version) if entry else None

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
        ops: list[Op] = [
            Put(
                f"active/{pointer.bot}",
                pointer.to_json(),
                expect=ABSENT if expect_revision is None else expect_revision,
            ),
            Check(version_key(version.bot, version.seq), expect=version.revision),
            *_audit_ops(audit),
        ]
        change = RecordChange(ACTIVE, f"active/{pointer.bot}", None, pointer.to_json())
        what = f"the active deployment of {pointer.bot!r}"
        entry = self._commit(tenant, ops, what, [change])[0]
        assert entry is not None
        return ActivePointer.from_json(pointer.to_json(), entry.version)

    def list_active(self, tenant: str, *, limit: int = 50, after: str | None = None) -> list[ActivePointer]:
        """Return active pointers by bot id (one scan of ``active/``)."""
        entries = self.kv.scan(
            self._table(tenant),
            prefix="active/",
            after=f"active/{after}" if after else None,
            limit=limit,
        )
        return [ActivePointer.from_json(e.value, e.version) for e in entries]

    def count_active(self, tenant: str) -> int:
        """Return the ``live`` counter."""
        return self.layout.count(self._table(tenant), "live", [()])[0]

    def delete_versions(
        self,
        tenant: str,
        bot: str,
        victims: Sequence[BotVersion],
        *,
        active_revision: int | None,
        audit: Sequence[AuditEvent] = (),
    ) -> None:
        """Delete ``victims`` and tombstone their index entries in one batch."""
        ops: list[Op] = [Check(f"active/{bot}", expect=ABSENT if active_revision is None else active_revision)]
        for v in victims:
            ops.append(Delete(version_key(bot, v.seq), expect=v.revision))
            ops.append(
                Put(
                    f"version-index/{bot}/{v.version}",
                    {"seq": v.seq, "digest": v.digest, "pruned": True},
                )
            )
        ops.extend(_audit_ops(audit))
        self._commit(tenant, ops, f"versions of {bot!r}")

    def list_bots(self, tenant: str, *, limit: int = 50, after: str | None = None) -> list[str]:
        """Return bot ids that have published."""
        entries = self.kv.scan(self._table(tenant), prefix="bot/", after=f"bot/{after}" if after else None, limit=limit)
        return [e.key.removeprefix("bot/") for e in entries]

    def audit_list(self, tenant: str, bot: str, *, limit: int = 50, after: str | None = None) -> list[AuditEvent]:
        """Return the bot's audit events newest first."""
        prefix = f"audit/{bot}/"
        entries = self.kv.scan(self._table(tenant), prefix=prefix, after=prefix + after if after else None, limit=limit)
        return [AuditEvent.from_json(e.value) for e in entries]

    def drop_tenant(self, tenant: str) -> None:
        """Drop the tenant's table."""
        self.tables.drop_tenant(tenant, [COLLECTION])
