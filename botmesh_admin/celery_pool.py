"""The Celery worker pool: prefork, with a free process still used after a broker reconnect.

Selected by ``settings.CELERY_WORKER_POOL``. Celery before 5.7 (and 5.7.0
exits on a Redis outage, so pyproject.toml keeps ``celery<5.7``) forgets on
every broker reconnect which pool processes are busy (``AsynPool.flush``
clears ``_busy_workers``). Its fair scheduler then writes the next task to a
process that is still running a long one, and that task waits — with idle
processes beside it — until the long task ends (issue 17, item 3;
celery/celery#10346, fixed in 5.7.0). Here ``flush`` keeps as busy every
process that still runs an accepted task, as 5.7.0 does.
"""

from __future__ import annotations

from typing import Any

from celery.concurrency import asynpool, prefork


class AsynPool(asynpool.AsynPool):
    """``AsynPool`` whose ``flush`` keeps the processes that still run a task marked busy."""

    def flush(self) -> None:
        busy = set(self._busy_workers)
        try:
            super().flush()
        finally:
            self._busy_workers.update(busy & self._running_task_fds())

    def _running_task_fds(self) -> set[Any]:
        """Return the inqueue fds of the live processes that run an accepted task."""
        running = set()
        for job in self._cache.values():
            if not job._accepted:
                continue
            proc = job._write_to or job._scheduled_for
            if proc is not None and proc._is_alive():
                running.add(proc.inqW_fd)
        return running


class TaskPool(prefork.TaskPool):
    """Celery's prefork pool (``-P prefork``) over the ``AsynPool`` above."""

    Pool = AsynPool
