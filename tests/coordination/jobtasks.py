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
        kv.commit(PROOF_TABLE, [Put(f"done/{occ}", {"pid": os.getpid(), "token": token}, expect=ABSENT)])
    except ConflictError:
        pass


EFFECT_TABLE = "coordination/proof/effects"
"""Where ``fenced_count`` and ``fenced_effect`` apply their effect (``applied``, a counter)."""


@shared_task(name="tests.coordination.fenced_count", ignore_result=True)
def fenced_count(table: str = EFFECT_TABLE) -> None:
    """Add 1 to ``applied`` in ``table``, fenced by the occurrence (the job API)."""
    from botmesh_admin.coordination.occurrences import current_occurrence
    from botmesh_admin.kv import Add

    occurrence = current_occurrence()
    assert occurrence is not None, "run outside the occurrence runner"
    RUNS.append(occurrence.to_json())
    occurrence.commit(table, [Add("applied", 1)])


@shared_task(name="tests.coordination.fenced_effect", ignore_result=True)
def fenced_effect(hold_s: float = 45.0) -> None:
    """Write ``start/<token>``, wait for ``go/<token>`` (at most ``hold_s``), then apply one fenced effect.

    The effect — ``applied`` + 1 and ``by/<token>`` — goes through the job API's
    fenced commit; a run refused as superseded writes ``refused/<token>``. The
    probes (``start``, ``go``, ``refused``) are plain writes the process test reads.
    """
    from botmesh_admin.coordination.occurrences import Superseded, current_occurrence
    from botmesh_admin.kv import Add, Put
    from botmesh_admin.kv.runtime import default_kv

    kv = default_kv()
    occurrence = current_occurrence()
    assert occurrence is not None, "run outside the occurrence runner"
    token = occurrence.fencing_token
    kv.commit(
        EFFECT_TABLE,
        [Put(f"start/{token}", {"pid": os.getpid(), "attempt": occurrence.attempt, "worker": occurrence.worker})],
    )
    deadline = time.monotonic() + hold_s
    while kv.get(EFFECT_TABLE, f"go/{token}") is None and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        occurrence.commit(EFFECT_TABLE, [Add("applied", 1), Put(f"by/{token}", {"pid": os.getpid()})])
    except Superseded as exc:
        kv.commit(EFFECT_TABLE, [Put(f"refused/{token}", {"pid": os.getpid(), "by_token": exc.by_token})])
        raise


def fenced_job(lease_s: int = 2) -> Any:
    """The job of the frozen-holder proof: ``fenced_effect`` every minute, a lease of ``lease_s``."""
    from botmesh_admin.coordination.domain import JobSettings, JobSpec, Schedule

    return JobSpec(
        "fenced-proof",
        "tests.coordination.fenced_effect",
        JobSettings(Schedule.interval(60)),
        lease_s=lease_s,
        description="issue 17, item 2: a fenced effect under a frozen holder",
    )
