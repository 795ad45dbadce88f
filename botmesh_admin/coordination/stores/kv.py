"""JobStore over any DurableKv: table ``coordination/system/jobs``.

Keys: ``settings/<job id>`` (``JobSettings`` as JSON; the entry version is the
settings version) and ``state/<job id>``; state writes go through a
``FenceGuard`` on resource ``scheduler`` in the same table, so the fence check
and the write are one atomic commit.
"""

from __future__ import annotations

from botmesh_admin.errors import Conflict
from botmesh_admin.kv import ABSENT, ConflictError, DurableKv, Put, TenantKv
from botmesh_admin.kv.tenant import RESERVED_TENANT_IDS

from ..domain import JobSettings, JobState
from ..fencing import FenceGuard


class KvJobStore:
    """JobStore over a DurableKv (``namespace`` is the tenant part of the table name)."""

    def __init__(self, kv: DurableKv, namespace: str = "system") -> None:
        self.kv = kv
        tables = TenantKv(kv, "coordination")
        # ``system`` (the default) is a reserved kernel namespace; tests pass their own ids.
        if namespace in RESERVED_TENANT_IDS:
            self.table = tables.reserved_table(namespace, "jobs")
        else:
            self.table = tables.table(namespace, "jobs")
        self._guard = FenceGuard(kv, self.table)

    def settings_get(self, job_id: str) -> tuple[JobSettings, int] | None:
        entry = self.kv.get(self.table, f"settings/{job_id}")
        return None if entry is None else (JobSettings.from_json(entry.value), entry.version)

    def settings_put(self, job_id: str, settings: JobSettings, *, expected_version: int) -> int:
        expect = ABSENT if expected_version == 0 else expected_version
        try:
            (entry,) = self.kv.commit(self.table, [Put(f"settings/{job_id}", settings.to_json(), expect=expect)])
        except ConflictError as exc:
            raise Conflict(f"job {job_id!r} was changed meanwhile", current_version=exc.current_version or 0) from None
        assert entry is not None
        return entry.version

    def state_get(self, job_id: str) -> JobState | None:
        entry = self.kv.get(self.table, f"state/{job_id}")
        return None if entry is None else JobState.from_json(entry.value)

    def state_put(self, states: dict[str, JobState], *, fence: int) -> None:
        ops = [Put(f"state/{job_id}", state.to_json()) for job_id, state in sorted(states.items())]
        self._guard.commit("scheduler", fence, ops)
