"""The deployment store contract (ARCHITECTURE §5, deployments).

Per tenant and bot the store keeps the published versions (newest first by
their per-bot ``seq``), an index of every version string ever published (pruned
ones stay as tombstones, so a version string is never reused), the active
pointer and the audit trail. Every write is a compare-and-set on the revisions
the caller read and commits its audit events atomically with it; a failed
expectation raises ``StaleRevision`` (a ``Conflict``) and writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from botmesh_admin.errors import Conflict
from deployments.domain import ActivePointer, AuditEvent, BotVersion


class StaleRevision(Conflict):
    """A write's expectation failed: what the caller read changed since (nothing was written).

    Services re-read and decide again (``cas_retry(..., retry_on=StaleRevision)``);
    a domain refusal is another ``Conflict`` subclass and is never retried. HTTP 409 ``conflict``.
    """


@dataclass(frozen=True)
class IndexEntry:
    """What the index remembers of a published version string, even after pruning."""

    seq: int
    digest: str
    pruned: bool = False


AuditFor = Callable[[BotVersion], Sequence[AuditEvent]]
"""Builds the audit events of a publish once the store has assigned the ``seq``."""


@runtime_checkable
class DeploymentStore(Protocol):
    """Persistence of bot versions; tested by ``tests/deployments/test_store_contract.py``."""

    def publish(self, tenant: str, version: BotVersion, *, audit: AuditFor) -> BotVersion:
        """Store a new version with the bot's next ``seq`` (1 for the first) and its audit events.

        Return the stored version (``seq`` and ``revision`` set). Raise
        ``StaleRevision`` if the version string is already in the index; then nothing
        is written. Concurrent publishes of different versions all succeed with
        distinct sequence numbers.
        """
        ...

    def index_get(self, tenant: str, bot: str, version: str) -> IndexEntry | None:
        """Return the index entry of ``version`` (also for a pruned one), or ``None``."""
        ...

    def get_version(self, tenant: str, bot: str, version: str) -> BotVersion | None:
        """Return the retained version with its revision, or ``None`` (never published, or pruned)."""
        ...

    def list_versions(
        self, tenant: str, bot: str, *, limit: int = 50, after_seq: int | None = None
    ) -> list[BotVersion]:
        """Return up to ``limit`` retained versions by descending ``seq``, each ``seq < after_seq``."""
        ...

    def update_version(
        self,
        tenant: str,
        version: BotVersion,
        *,
        expect_revision: int,
        audit: Sequence[AuditEvent] = (),
    ) -> BotVersion:
        """Replace the version's record (its gate states) if its revision is ``expect_revision``.

        Return it with the new revision; raise ``StaleRevision`` otherwise (also if pruned).
        """
        ...

    def get_active(self, tenant: str, bot: str) -> ActivePointer | None:
        """Return the bot's active pointer with its revision, or ``None`` if none was ever set."""
        ...

    def set_active(
        self,
        tenant: str,
        pointer: ActivePointer,
        *,
        expect_revision: int | None,
        version: BotVersion,
        audit: Sequence[AuditEvent] = (),
    ) -> ActivePointer:
        """Point the bot at ``pointer.version`` if the pointer's revision is ``expect_revision``
        (``None``: no pointer yet) and ``version`` is still stored at ``version.revision``.

        Return the pointer with its new revision; raise ``StaleRevision`` otherwise.
        """
        ...

    def delete_versions(
        self,
        tenant: str,
        bot: str,
        victims: Sequence[BotVersion],
        *,
        active_revision: int | None,
        audit: Sequence[AuditEvent] = (),
    ) -> None:
        """Delete ``victims`` (each at its ``revision``) and mark them pruned in the index, atomically.

        Raise ``StaleRevision`` if any victim changed or the active pointer's revision
        is not ``active_revision`` (``None``: no pointer); then nothing is deleted.
        """
        ...

    def list_active(self, tenant: str, *, limit: int = 50, after: str | None = None) -> list[ActivePointer]:
        """Return up to ``limit`` active pointers of ``tenant`` by bot id, bots ``> after``.

        Only bots with a live deployment are listed (a read of one page).
        """
        ...

    def count_active(self, tenant: str) -> int:
        """Return how many bots of ``tenant`` have a live deployment (a counter, not a walk)."""
        ...

    def list_bots(self, tenant: str, *, limit: int = 50, after: str | None = None) -> list[str]:
        """Return up to ``limit`` bot ids of ``tenant`` that have published, ascending, ``> after``."""
        ...

    def audit_list(self, tenant: str, bot: str, *, limit: int = 50, after: str | None = None) -> list[AuditEvent]:
        """Return up to ``limit`` audit events of ``bot``, newest first, with ids ``> after``."""
        ...

    def drop_tenant(self, tenant: str) -> None:
        """Delete everything of ``tenant`` (tenant erasure)."""
        ...
