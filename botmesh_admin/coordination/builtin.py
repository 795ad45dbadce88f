"""The kernel's own scheduled jobs (tasks in ``coordination.tasks``).

Each one's effects are fenced by its occurrence (ARCHITECTURE §9, ``occurrences``):
``kv.sweep`` checks ``still_holds()`` before each batch it deletes
(``services.kv_sweep``), so a run that lost its occurrence stops.
"""

from __future__ import annotations

from .domain import JobSettings, JobSpec, Schedule
from .registry import register_job

KV_SWEEP = register_job(
    JobSpec(
        "kv.sweep",
        "coordination.kv_sweep",
        JobSettings(Schedule.interval(300), catch_up="latest", catch_up_window_s=3600),
        lease_s=120,
        description="Reclaim expired Kv entries (TTL) in batches.",
    )
)
