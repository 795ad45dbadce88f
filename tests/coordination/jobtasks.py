"""Celery tasks the scheduled-jobs tests schedule (in-process and in real worker processes)."""

from __future__ import annotations

import os
import time
from typing import Any

from celery import shared_task

RUNS: list[dict[str, Any]] = []
"""Occurrences ``count_run`` saw in this process."""

PROOF_TABLE = "coordination/proof/runs"


@shared_task(name="tests.coordination.count_run", ignore_result=True)
def count_run(occurrence: dict[str, Any], fail: bool = False) -> None:
    """Record the occurrence in ``RUNS`` (and raise if ``fail``)."""
    RUNS.append(occurrence)
    if fail:
        raise RuntimeError("the job failed on purpose")


@shared_task(name="tests.coordination.record_run", ignore_result=True)
def record_run(occurrence: dict[str, Any], duration_s: float = 0.4) -> None:
    """Write ``start/<occurrence>/<token>`` then, after ``duration_s``, ``done/<occurrence>`` once.

    The completion is idempotent by occurrence id (``ABSENT``): a retry of a run
    killed after it completed does not complete it twice.
    """
    from botmesh_admin.kv import ABSENT, ConflictError, Put
    from botmesh_admin.kv.runtime import default_kv

    kv = default_kv()
    occ, token = occurrence["id"], occurrence["fencing_token"]
    kv.commit(PROOF_TABLE, [Put(f"start/{occ}/{token}", {"pid": os.getpid(), "at": time.time()})])
    time.sleep(duration_s)
    try:
        kv.commit(
            PROOF_TABLE, [Put(f"done/{occ}", {"pid": os.getpid(), "token": token}, expect=ABSENT)]
        )
    except ConflictError:
        pass
