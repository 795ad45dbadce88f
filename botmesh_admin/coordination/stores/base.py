"""The JobStore contract: operator settings of jobs and the scheduler leader's progress.

Settings are written by the UI with compare-and-set on a version. The
scheduler's state is written only by the scheduler leader and *fenced*: each
write presents the leadership's fence, and a fence older than one that already
wrote is refused with ``StaleFence`` (a deposed leader cannot move a job back).
Every implementation passes ``tests/coordination/test_job_store.py``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..domain import JobSettings, JobState


@runtime_checkable
class JobStore(Protocol):
    """Persistence of job settings and scheduler state. All methods are thread-safe."""

    def settings_get(self, job_id: str) -> tuple[JobSettings, int] | None:
        """Return ``(settings, version)`` saved for ``job_id``, or None if never edited."""
        ...

    def settings_put(self, job_id: str, settings: JobSettings, *, expected_version: int) -> int:
        """Save ``settings`` if the stored version is ``expected_version`` (0: none yet); return the new version.

        Raise ``Conflict`` (with ``current_version``) otherwise.
        """
        ...

    def state_get(self, job_id: str) -> JobState | None:
        """Return the scheduler's state of ``job_id``, or None before its first tick."""
        ...

    def state_put(self, states: dict[str, JobState], *, fence: int) -> None:
        """Save ``states`` atomically, fenced by the scheduler leadership's ``fence``.

        Raise ``StaleFence`` if a higher fence has written; nothing is saved then.
        """
        ...
