"""Writes of the scheduled jobs (HackSoft services): settings edits, the leader's tick, a run.

The occurrence ledger is the event journal: an occurrence is appended as
``job.occurrence`` (tenant ``system``, channel ``jobs``) with the idempotency
key ``<job id>@<scheduled ms>`` *before* any worker is told to run it, so two
beats, a redelivered message or a worker killed mid-run never make two records
of one occurrence; a worker claims it with a fenced lease, runs it and acks it
(a killed run is claimed again after its lease: retried, not duplicated).
The task's effects are fenced by that claim through the job API
(``occurrences``): committed once per occurrence, and refused for a run that
lost the occurrence (a holder frozen past its lease), which is recorded as
superseded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from botmesh_admin.clock import now_ms
from botmesh_admin.errors import NotFound, ValidationError

from .base import LeaseHandle, LeaseLost
from .domain import (
    CATCH_UP_POLICIES,
    JOBS_CHANNEL_PREFIX,
    OCCURRENCE_TYPE,
    RUN_TASK,
    SYSTEM_TENANT,
    Job,
    JobSettings,
    JobSpec,
    JobState,
    Schedule,
    due_occurrences,
    effective_job,
    jobs_channel,
    jobs_channels,
    occurrence_id,
    validate_job_id,
)
from .stores import job_store, system_table
from .stores.base import JobStore

__all__ = [  # the names other modules (the beat, handlers, tests) read here; selectors read domain and stores
    "JOBS_CHANNEL_PREFIX", "OCCURRENCE_TYPE", "RUN_TASK", "SYSTEM_TENANT", "effective_job", "job_store",
    "jobs_channel", "jobs_channels", "system_table",
]  # fmt: skip

log = logging.getLogger("botmesh.coordination.jobs")

Send = Callable[[str, dict[str, Any], dict[str, Any]], None]


def job_update(
    job_id: str,
    *,
    every_s: int | None = None,
    crontab: str | None = None,
    enabled: bool,
    catch_up: str,
    catch_up_window_s: int,
    expected_version: int,
    actor: str,
    specs: Iterable[JobSpec] | None = None,
    store: JobStore | None = None,
    at_ms: int | None = None,
) -> Job:
    """Save an operator's settings of ``job_id``: exactly one of ``every_s`` / ``crontab``.

    Occurrences before this moment are never caught up under the new settings.
    Raise ``NotFound`` for an undeclared job, ``ValidationError`` naming the
    field, ``Conflict`` if ``expected_version`` is stale.
    """
    validate_job_id(job_id, "job_id")
    store = store or job_store()
    spec = _spec(job_id, specs)
    if (every_s is None) == (crontab is None or crontab.strip() == ""):
        raise ValidationError("schedule", "give either an interval in seconds or a crontab")
    schedule = Schedule.interval(every_s) if every_s is not None else Schedule.cron(crontab or "")
    if catch_up not in CATCH_UP_POLICIES:
        raise ValidationError("catch_up", f"must be one of {', '.join(CATCH_UP_POLICIES)}")
    settings = JobSettings(
        schedule,
        enabled=enabled,
        catch_up=catch_up,
        catch_up_window_s=catch_up_window_s,
        resume_after_ms=now_ms() if at_ms is None else at_ms,
        updated_by=actor,
    )
    version = store.settings_put(job_id, settings, expected_version=expected_version)
    log.info("job %s updated by %s: %s, enabled=%s, catch-up %s", job_id, actor, schedule.describe(), enabled, catch_up)
    return Job(spec, settings, version)


def _spec(job_id: str, specs: Iterable[JobSpec] | None) -> JobSpec:
    if specs is None:
        from .registry import declared_jobs

        specs = declared_jobs()
    for spec in specs:
        if spec.id == job_id:
            return spec
    raise NotFound(f"job {job_id!r} is not declared")


@dataclass(frozen=True)
class Emitted:
    """One occurrence the leader emitted in a tick."""

    job_id: str
    scheduled_ms: int
    durable: bool


def scheduler_tick(
    *,
    specs: Iterable[JobSpec],
    lease: LeaseHandle,
    send: Send,
    at_ms: int,
    store: JobStore | None = None,
    journal: Any = None,
) -> list[Emitted]:
    """Emit every occurrence due at ``at_ms`` as the scheduler leader holding ``lease``.

    Durable occurrences are appended to the ledger first (idempotent), then the
    leader's progress is saved fenced by ``lease.fence``, and only then are the
    Celery messages sent. Raise ``LeaseLost`` if ``lease`` is no longer valid and
    ``StaleFence`` if a newer leader has written (nothing is sent then).
    """
    from botmesh_admin.events import default_journal
    from botmesh_admin.events.base import MAX_BATCH
    from botmesh_admin.events.services import NewEvent, event_publish_many

    store = store or job_store()
    journal = journal or default_journal()
    specs = list(specs)
    emitted: list[Emitted] = []
    states: dict[str, JobState] = {}
    occurrences: list[NewEvent] = []
    for spec in specs:
        job = effective_job(spec, store)
        state = store.state_get(spec.id)
        due, considered = due_occurrences(job.settings, state, at_ms)
        if considered is None:
            continue
        for scheduled in due:
            if not lease.valid():
                raise LeaseLost("the scheduler leadership was lost during the tick")
            if spec.durable:
                occurrences.append(
                    NewEvent(
                        type=OCCURRENCE_TYPE,
                        channel=jobs_channel(spec),
                        idempotency_key=occurrence_id(spec.id, scheduled),
                        payload={
                            "job": spec.id,
                            "task": spec.task,
                            "scheduled_ms": scheduled,
                            "kwargs": spec.kwargs,
                            "pass_occurrence": spec.pass_occurrence,
                        },
                    )
                )
            emitted.append(Emitted(spec.id, scheduled, spec.durable))
        last = due[-1] if due else (state.last_emitted_ms if state else None)
        states[spec.id] = JobState(considered, last)
    if not states:
        return []
    if not lease.valid():
        raise LeaseLost("the scheduler leadership was lost during the tick")
    # One ledger commit for the tick's durable occurrences; ``jobs.run`` (below) drains their
    # channels with the occurrence runner, so no ``events.drain`` is queued for them.
    for start in range(0, len(occurrences), MAX_BATCH):
        event_publish_many(SYSTEM_TENANT, occurrences[start : start + MAX_BATCH], journal=journal, wake=False)
    run_channels = {event.channel for event in occurrences if event.channel}
    store.state_put(states, fence=lease.fence)
    by_id = {spec.id: spec for spec in specs}
    for item in emitted:
        spec = by_id[item.job_id]
        if not item.durable:
            send(spec.task, dict(spec.kwargs), {"expires": 60})
    for channel in sorted(run_channels):
        send(RUN_TASK, {"channel": channel}, {})
    for item in emitted:
        log.info("job %s: occurrence %s emitted", item.job_id, occurrence_id(item.job_id, item.scheduled_ms))
    return emitted


def job_occurrence_run(record: Any, *, journal: Any = None, kv: Any = None) -> None:
    """Run the Celery task of one claimed ``job.occurrence`` record, in this process.

    The task runs inside an ``OccurrenceContext`` (``occurrences.current_occurrence()``)
    for this claim: its ``commit`` fences the task's effects by the claim and
    ``still_holds()`` asks the ledger whether the claim is still live. After
    the task returned, the claim is checked once more: a run that lost the
    occurrence meanwhile (frozen past its lease) is recorded as superseded and
    raises ``Superseded`` (its ack would be refused anyway). Raise whatever the
    task raises (the journal retries it, then dead-letters it).
    """
    from botmesh_admin.celery import app

    from .occurrences import OccurrenceContext, running

    payload = record.payload
    task = app.tasks.get(payload["task"])
    if task is None:
        raise LookupError(f"no Celery task named {payload['task']!r}")
    occurrence = OccurrenceContext.from_record(record, journal=journal, kv=kv)
    kwargs = dict(payload.get("kwargs") or {})
    if payload.get("pass_occurrence"):
        kwargs["occurrence"] = occurrence.to_json()
    with running(occurrence):
        task(**kwargs)
    occurrence.check()


SWEEP_BATCH = 200


def kv_sweep(*, limit: int = 1000, batch: int = SWEEP_BATCH, kv: Any = None) -> int:
    """Reclaim up to ``limit`` expired Kv entries in batches of ``batch``; return how many were removed.

    Run as the ``kv.sweep`` occurrence, each batch is a side effect the Kv
    cannot fence in a commit (``sweep`` deletes across tables), so the run
    checks ``still_holds()`` before each one and stops with ``Superseded`` once
    it lost the occurrence. A batch a superseded run deleted anyway removed
    only entries that were already invisible (expired): deleting them twice is
    deleting them once.
    """
    from botmesh_admin.kv.runtime import default_kv

    from .occurrences import current_occurrence

    kv = kv or default_kv()
    occurrence = current_occurrence()
    removed = 0
    while removed < limit:
        if occurrence is not None:
            occurrence.check()
        size = min(batch, limit - removed)
        done = kv.sweep(size)
        removed += done
        if done < size:
            break
    return removed


def jobs_drain(channel: str, *, limit: int = 20, journal: Any = None) -> dict[str, int]:
    """Claim and run up to ``limit`` ready occurrences of ``channel``; return the worker's counts."""
    from botmesh_admin.events import default_journal
    from botmesh_admin.events.worker import EventWorker

    if not channel.startswith(JOBS_CHANNEL_PREFIX) or not channel.endswith("s"):
        raise ValidationError("channel", "not a jobs channel")
    try:
        lease_s = int(channel[len(JOBS_CHANNEL_PREFIX) : -1])
    except ValueError:
        raise ValidationError("channel", "not a jobs channel") from None
    journal = journal or default_journal()
    # One at a time: a run may take its whole lease, and a held occurrence is one no other worker runs.
    worker = EventWorker(journal, lease_ms=lease_s * 1000, channel=channel, claim_batch=1)
    return worker.run_batch(lambda record: job_occurrence_run(record, journal=journal), limit)


def scheduler_leader_publish(replica_id: str, incarnation: str, fence: int, *, store_kv: Any = None) -> None:
    """Record (in the Kv) that this beat leads the scheduler through the file lock (embedded default).

    The replicas dashboard shows it; Redis deployments publish through the coordinator instead.
    """
    import os
    import socket

    from botmesh_admin.kv import Put
    from botmesh_admin.kv.runtime import default_kv

    kv = store_kv or default_kv()
    table = system_table(kv)
    value = {
        "replica_id": replica_id,
        "incarnation": incarnation,
        "fence": fence,
        "at_ms": now_ms(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    kv.commit(table, [Put("leader/scheduler", value, ttl_ms=60_000)])
