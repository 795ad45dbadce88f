"""Where scheduled jobs are declared in code.

Three sources, merged by job id (first wins):

1. ``register_job(JobSpec(...))`` or the ``@scheduled_job(...)`` decorator on a
   Celery task, anywhere imported at start-up (a ``tasks.py``);
2. ``scheduled_jobs = [JobSpec(...)]`` on an app's ``AppConfig``;
3. plain Celery ``beat_schedule`` entries (``durable=False``: emitted by the
   leader only, without the occurrence ledger; ids sanitised to the job id rule).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from .domain import JobSettings, JobSpec, Schedule

log = logging.getLogger("botmesh.coordination.jobs")

_lock = threading.Lock()
_jobs: dict[str, JobSpec] = {}


def register_job(spec: JobSpec) -> JobSpec:
    """Declare ``spec``; raise ``ValueError`` if another job already has its id."""
    with _lock:
        current = _jobs.get(spec.id)
        if current is not None and current != spec:
            raise ValueError(f"job {spec.id!r} is already declared for task {current.task!r}")
        _jobs[spec.id] = spec
    return spec


def unregister_job(job_id: str) -> None:
    """Forget a declared job (tests)."""
    with _lock:
        _jobs.pop(job_id, None)


def scheduled_job(
    job_id: str,
    *,
    every_s: int | None = None,
    crontab: str | None = None,
    enabled: bool = True,
    catch_up: str = "latest",
    catch_up_window_s: int = 3600,
    durable: bool = True,
    pass_occurrence: bool = False,
    lease_s: int = 60,
    kwargs: dict[str, Any] | None = None,
    description: str = "",
) -> Callable[[Any], Any]:
    """Decorate a Celery task (applied after ``@shared_task``) to run it on a schedule."""
    schedule = Schedule.cron(crontab) if crontab is not None else Schedule.interval(every_s)  # type: ignore[arg-type]
    defaults = JobSettings(schedule, enabled=enabled, catch_up=catch_up, catch_up_window_s=catch_up_window_s)

    def decorator(task: Any) -> Any:
        register_job(
            JobSpec(
                job_id,
                task.name,
                defaults,
                kwargs=dict(kwargs or {}),
                durable=durable,
                pass_occurrence=pass_occurrence,
                lease_s=lease_s,
                description=description,
            )
        )
        return task

    return decorator


def _sanitise(name: str) -> str:
    cleaned = re.sub(r"[^a-z0-9_.:-]+", "-", name.lower()).strip("-_.:")[:100]
    return cleaned or "job"


def _from_beat_entry(name: str, entry: dict[str, Any]) -> JobSpec | None:
    from celery.schedules import crontab, schedule

    raw = entry.get("schedule")
    try:
        if isinstance(raw, (int, float)):
            sched = Schedule.interval(max(1, round(raw)))
        elif isinstance(raw, timedelta):
            sched = Schedule.interval(max(1, round(raw.total_seconds())))
        elif isinstance(raw, crontab):
            sched = Schedule.cron(
                " ".join(
                    str(getattr(raw, f"_orig_{f}"))
                    for f in ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
                )
            )
        elif isinstance(raw, schedule):
            sched = Schedule.interval(max(1, round(raw.run_every.total_seconds())))
        else:
            return None
        return JobSpec(
            _sanitise(name),
            entry["task"],
            JobSettings(sched, catch_up="skip"),
            kwargs=dict(entry.get("kwargs") or {}),
            durable=False,
            description=f"Celery beat entry {name!r}",
        )
    except (ValueError, TypeError, KeyError):
        log.warning("beat entry %r cannot be scheduled by the leader scheduler; ignored", name)
        return None


def declared_jobs(app: Any = None) -> list[JobSpec]:
    """Return every declared job, sorted by id (importing the apps' task modules first)."""
    from django.apps import apps

    from . import builtin  # noqa: F401 (registers the kernel's own jobs)

    if app is None:
        from botmesh_admin.celery import app as default_app

        default_app.loader.import_default_modules()
        app = default_app
    found: dict[str, JobSpec] = {}
    with _lock:
        found.update(_jobs)
    for config in apps.get_app_configs():
        for spec in getattr(config, "scheduled_jobs", []):
            found.setdefault(spec.id, spec)
    for name, entry in (app.conf.beat_schedule or {}).items():
        spec = _from_beat_entry(name, entry)
        if spec is not None:
            found.setdefault(spec.id, spec)
    return sorted(found.values(), key=lambda s: s.id)
