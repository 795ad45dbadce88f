"""The reference JobStore, in memory."""

from __future__ import annotations

import threading

from botmesh_admin.errors import Conflict

from ..base import StaleFence
from ..domain import JobSettings, JobState


class MemoryJobStore:
    """JobStore in a dict (one process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._settings: dict[str, tuple[JobSettings, int]] = {}
        self._states: dict[str, JobState] = {}
        self._fence = 0

    def settings_get(self, job_id: str) -> tuple[JobSettings, int] | None:
        with self._lock:
            return self._settings.get(job_id)

    def settings_put(self, job_id: str, settings: JobSettings, *, expected_version: int) -> int:
        with self._lock:
            current = self._settings.get(job_id)
            version = current[1] if current else 0
            if version != expected_version:
                raise Conflict(f"job {job_id!r} was changed meanwhile", current_version=version)
            self._settings[job_id] = (settings, version + 1)
            return version + 1

    def state_get(self, job_id: str) -> JobState | None:
        with self._lock:
            return self._states.get(job_id)

    def state_put(self, states: dict[str, JobState], *, fence: int) -> None:
        with self._lock:
            if fence < self._fence:
                raise StaleFence(f"fence {fence} is older than {self._fence}", current_version=self._fence)
            self._fence = fence
            self._states.update(states)
