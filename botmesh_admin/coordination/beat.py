"""``LeaderScheduler``: a Celery beat scheduler that emits only while it leads.

Run any number of beats with ``celery -A botmesh_admin beat -S
botmesh_admin.coordination.beat:LeaderScheduler``. Each tick a beat asks for
the ``scheduler`` leadership — through the process's coordinator (Redis, or
the Kv coordinator of the embedded default), or, with the in-process hub
(``BOTMESH_COORDINATION_URL=memory:``), through an exclusive lock on a file in
the data directory (one host; a second beat waits) — and only
the leader emits: see ``services.scheduler_tick`` for the occurrence ledger.
The schedule itself is not kept in beat's shelve file: the declared jobs and
their settings are read from code and the Kv every tick.
"""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import socket
import time
from pathlib import Path
from typing import Any

from celery.beat import Scheduler

from .base import LeaseHandle, LeaseLost, StaleFence
from .domain import JobSpec

log = logging.getLogger("botmesh.coordination.beat")

TICK_S = 1.0
SPECS_REFRESH_S = 30.0
SAFETY_NET_S = 5.0
SCHEDULER_LEAD = "scheduler"


class FileLease:
    """Leadership held through ``flock`` on a file: valid until released or the process dies."""

    def __init__(self, handle: Any, fence: int, owner: str) -> None:
        self._handle = handle
        self.key = SCHEDULER_LEAD
        self.fence = fence
        self.previous_holder: str | None = None
        self.owner = owner

    def valid(self) -> bool:
        return self._handle is not None

    def remaining_ms(self) -> int:
        return 2**31 if self._handle is not None else 0

    def release(self) -> bool:
        if self._handle is None:
            return False
        fcntl.flock(self._handle, fcntl.LOCK_UN)
        self._handle.close()
        self._handle = None
        return True


class FileElector:
    """Scheduler leadership without Redis: ``flock`` on ``<data dir>/scheduler.lock``.

    The fence comes from a durable counter in the Kv (``coordination/system/fences``),
    raised by compare-and-set on every acquisition, so it only grows. The
    leader's status is published in the Kv for the replicas dashboard.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.replica_id = f"{socket.gethostname()}-{os.getpid()}"
        self.incarnation = secrets.token_hex(4)
        self.lease: FileLease | None = None
        self._published = 0.0

    def lead(self) -> LeaseHandle | None:
        if self.lease is None:
            handle = open(self.path, "a+")  # noqa: SIM115 (held for the leadership's life)
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                return None
            from botmesh_admin.kv.runtime import default_kv

            from .redis import FenceWatermark

            _, fence = FenceWatermark(default_kv(), "scheduler-file").raise_past(0, 1)
            self.lease = FileLease(handle, fence, f"{self.replica_id}/{self.incarnation}")
            log.info("scheduler leadership taken (file lock, fence %s)", fence)
        if time.monotonic() - self._published >= SAFETY_NET_S:
            self._publish()
        return self.lease

    def _publish(self) -> None:
        from .services import scheduler_leader_publish

        assert self.lease is not None
        scheduler_leader_publish(self.replica_id, self.incarnation, self.lease.fence)
        self._published = time.monotonic()

    def close(self) -> None:
        if self.lease is not None:
            self.lease.release()
            self.lease = None


class CoordinatorElector:
    """Scheduler leadership through the process's coordinator (Redis or the Kv)."""

    def __init__(self) -> None:
        from .runtime import default_coordinator

        self.coordinator = default_coordinator(role="beat")

    def lead(self) -> LeaseHandle | None:
        return self.coordinator.try_lead(SCHEDULER_LEAD)

    def close(self) -> None:
        from .runtime import shutdown

        shutdown()


def make_elector() -> FileElector | CoordinatorElector:
    """Return the elector for this deployment: the coordinator, or the file lock with the in-process hub."""
    from django.conf import settings

    from .runtime import coordination_url

    if coordination_url() != "memory:":
        return CoordinatorElector()
    return FileElector(Path(settings.BOTMESH_DATA_DIR) / "scheduler.lock")


class LeaderScheduler(Scheduler):
    """Celery beat scheduler: only the ``scheduler`` leader emits (see the module docstring)."""

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        self._elector: FileElector | CoordinatorElector | None = None
        self._specs: list[JobSpec] = []
        self._specs_at = 0.0
        self._safety_net_at = 0.0
        self._was_leader = False
        kwargs.pop("schedule_filename", None)
        super().__init__(app, *args, **kwargs)

    def setup_schedule(self) -> None:
        self._elector = make_elector()

    def _declared(self) -> list[JobSpec]:
        if not self._specs or time.monotonic() - self._specs_at > SPECS_REFRESH_S:
            from .registry import declared_jobs

            self._specs = declared_jobs(self.app)
            self._specs_at = time.monotonic()
        return self._specs

    def _send(self, task: str, kwargs: dict[str, Any], options: dict[str, Any]) -> None:
        try:
            self.app.send_task(task, kwargs=kwargs, **options)
        except Exception as exc:  # noqa: BLE001 (the ledger holds the occurrence; the safety net resends)
            log.warning("could not send %s: %s", task, type(exc).__name__)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Emit what is due if this beat leads; return seconds until the next tick."""
        from . import services

        if self._elector is None:
            self.setup_schedule()
        assert self._elector is not None
        try:
            lease = self._elector.lead()
        except Exception as exc:  # noqa: BLE001 (Redis or the Kv down: try again next tick)
            log.warning("scheduler: cannot reach the coordinator: %s", type(exc).__name__)
            return TICK_S
        if lease is None:
            if self._was_leader:
                log.info("scheduler: no longer the leader")
            self._was_leader = False
            return TICK_S
        if not self._was_leader:
            log.info("scheduler: leading with fence %s", lease.fence)
        self._was_leader = True
        try:
            services.scheduler_tick(specs=self._declared(), lease=lease, send=self._send, at_ms=services.now_ms())
        except (LeaseLost, StaleFence) as exc:
            log.warning("scheduler: leadership lost during a tick: %s", exc.code)
            return TICK_S
        except Exception:  # noqa: BLE001 (a bad tick must not stop beat)
            log.exception("scheduler: tick failed")
            return TICK_S
        if time.monotonic() - self._safety_net_at >= SAFETY_NET_S:
            # Re-runs occurrences whose worker died or whose message was lost.
            for channel in services.jobs_channels(self._declared()):
                self._send(services.RUN_TASK, {"channel": channel}, {"expires": SAFETY_NET_S * 2})
            self._safety_net_at = time.monotonic()
        return TICK_S - (time.time() % TICK_S)  # wake near whole seconds

    def sync(self) -> None:
        """Nothing to persist: the ledger and the Kv hold the state."""

    def close(self) -> None:
        if self._elector is not None:
            self._elector.close()
            self._elector = None

    @property
    def info(self) -> str:
        kind = type(self._elector).__name__ if self._elector else "not started"
        return f"    . leader scheduler ({kind})"
