"""Fenced writes: a Kv commit guarded by the fence of a lease (Kleppmann's fencing token).

A lock or lease alone cannot stop a holder that was paused (GC, SIGSTOP, a slow
disk) past its expiry from writing after the next holder took over. The store
must refuse it: ``FenceGuard`` keeps, next to the guarded data in the same Kv
table, an entry with the highest fence that has written to a *resource*, and
commits the caller's operations in one atomic batch with a compare-and-set of
that entry. A fence lower than the highest seen raises ``StaleFence``; an equal
fence (the same holder writing again) is accepted.
"""

from __future__ import annotations

from collections.abc import Sequence

from botmesh_admin.kv import ABSENT, DurableKv, Entry, Op, Put
from botmesh_admin.kv.cas import cas_retry

from .base import LeaseHandle, LeaseLost, StaleFence, validate_key

FENCE_KEY_PREFIX = "~fence/"
FENCE_CAS_ATTEMPTS = 64
"""Re-reads of a fence entry another writer moved before a fenced write gives up (``Conflict``)."""


class FenceGuard:
    """Fenced commits into one Kv ``table`` (see the module docstring)."""

    def __init__(self, kv: DurableKv, table: str) -> None:
        self.kv = kv
        self.table = table

    def highest(self, resource: str) -> int:
        """Return the highest fence that has written ``resource`` (0 if none)."""
        entry = self.kv.get(self.table, FENCE_KEY_PREFIX + validate_key(resource, "resource"))
        return int(entry.value["fence"]) if entry is not None else 0

    def commit(
        self, resource: str, fence: int, ops: Sequence[Op] = (), *, lease: LeaseHandle | None = None
    ) -> list[Entry | None]:
        """Apply ``ops`` atomically if ``fence`` is not older than any fence that wrote ``resource``.

        Return the entries ``kv.commit`` returns for ``ops``. Raise ``LeaseLost``
        if ``lease`` is given and no longer valid locally, ``StaleFence`` (with
        the highest fence as ``current_version``) if a later holder has written,
        and ``ConflictError`` if one of ``ops``' own expectations fails.
        """
        key = FENCE_KEY_PREFIX + validate_key(resource, "resource")

        def attempt() -> list[Entry | None]:
            if lease is not None and not lease.valid():
                raise LeaseLost(f"the lease with fence {fence} is no longer held")
            entry = self.kv.get(self.table, key)
            highest = int(entry.value["fence"]) if entry is not None else 0
            if fence < highest:
                raise StaleFence(
                    f"fence {fence} is older than fence {highest} that already wrote {resource!r}",
                    current_version=highest,
                )
            guard = Put(key, {"fence": fence}, expect=entry.version if entry is not None else ABSENT)
            return self.kv.commit(self.table, [guard, *ops])[1:]

        # Another writer moved the fence entry between our read and commit: re-check. A miss of
        # one of ``ops``' own expectations is the caller's ConflictError.
        return cas_retry(
            attempt,
            what=f"the fence of {resource!r}",
            attempts=FENCE_CAS_ATTEMPTS,
            retry_if=lambda miss: miss.key == key,
        )
