"""Celery tasks of the coordination app: thin wrappers over services (STYLE §9).

They import services inside the task function (HackSoft's styleguide; ``tests/test_import_graph.py``).
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from celery.signals import worker_ready, worker_shutdown

from .domain import RUN_TASK


@shared_task(name=RUN_TASK, ignore_result=True)
def run_jobs(channel: str, limit: int = 20) -> dict[str, int]:
    """Claim and run ready job occurrences of ``channel`` from the ledger; return the counts."""
    from .services import jobs_drain

    return jobs_drain(channel, limit=limit)


@shared_task(name="coordination.kv_sweep", ignore_result=True)
def kv_sweep(limit: int = 1000) -> int:
    """Reclaim up to ``limit`` expired Kv entries (batches checked against the occurrence); return how many."""
    from .services import kv_sweep as sweep

    return sweep(limit=limit)


@worker_ready.connect(weak=False)
def _register_worker(**kwargs: Any) -> None:
    """Show the worker on the replicas dashboard (a coordinator with role ``worker``)."""
    from .runtime import default_coordinator

    default_coordinator(role="worker")


@worker_shutdown.connect(weak=False)
def _unregister_worker(**kwargs: Any) -> None:
    from .runtime import shutdown

    shutdown()
