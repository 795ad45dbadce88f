"""Durable scheduled jobs: the value types and the scheduling rules (ARCHITECTURE §9).

A *job* is a periodic task declared in code (``JobSpec``) whose schedule an
operator may change in the UI (``JobSettings``). Each *occurrence* has the
deterministic id ``<job id>@<scheduled time in epoch ms>``; interval schedules
are aligned on the epoch (every beat computes the same times) and crontab
schedules on UTC minutes, with Celery's crontab syntax and semantics (every
field must match, ``day_of_week`` 0 = Sunday).

After downtime, the occurrences that were missed (older than
``ON_TIME_GRACE_MS``) follow the job's *catch-up policy*: ``skip`` them,
run the ``latest`` one if it is within ``catch_up_window_s``, or run ``all``.
Times are epoch milliseconds; durations in the names' units.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from botmesh_admin.errors import BadType, ValidationError

CATCH_UP_POLICIES = ("skip", "latest", "all")
JOB_ID_RE = re.compile(r"^[a-z0-9][a-z0-9_.:-]{0,99}$")
TASK_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,199}$")
ON_TIME_GRACE_MS = 5000
MAX_CATCH_UP = 1000
MIN_EVERY_S = 1
MAX_EVERY_S = 366 * 24 * 3600
MAX_WINDOW_S = 366 * 24 * 3600
MAX_LEASE_S = 24 * 3600
CRON_FIELDS = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
_MINUTE_MS = 60_000


def validate_job_id(job_id: object, field_name: str = "job.id") -> str:
    """Return ``job_id`` if it is 1-100 characters of a-z, 0-9, ``_ . : -``; else raise."""
    if not isinstance(job_id, str):
        raise BadType(field_name, "must be a string")
    if not JOB_ID_RE.fullmatch(job_id):
        raise ValidationError(field_name, "must be 1-100 characters of a-z, 0-9, '_', '.', ':' or '-'")
    return job_id


def _int(value: object, field_name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadType(field_name, "must be an integer")
    if not low <= value <= high:
        raise ValidationError(field_name, f"must be between {low} and {high}")
    return value


@dataclass(frozen=True)
class Schedule:
    """Either ``every_s`` seconds (aligned on the epoch) or a 5-field UTC ``crontab``."""

    every_s: int | None = None
    crontab: str | None = None
    _sets: tuple[frozenset[int], ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def interval(cls, every_s: int) -> Schedule:
        """Return a schedule every ``every_s`` seconds; raise ``ValidationError`` (field ``every_s``)."""
        return cls(every_s=_int(every_s, "schedule.every_s", MIN_EVERY_S, MAX_EVERY_S))

    @classmethod
    def cron(cls, expression: str) -> Schedule:
        """Return a schedule for ``"minute hour day_of_month month_of_year day_of_week"`` (UTC)."""
        from celery.schedules import crontab

        if not isinstance(expression, str):
            raise BadType("schedule.crontab", "must be a string")
        parts = expression.split()
        if len(parts) != 5:
            raise ValidationError(
                "schedule.crontab", "must have 5 fields: minute hour day_of_month month_of_year day_of_week"
            )
        try:
            parsed = crontab(**dict(zip(CRON_FIELDS, parts, strict=True)))
        except (ValueError, TypeError, KeyError) as exc:
            raise ValidationError("schedule.crontab", f"not a valid crontab: {exc}") from None
        sets = tuple(frozenset(getattr(parsed, name)) for name in CRON_FIELDS)
        if not all(sets):
            raise ValidationError("schedule.crontab", "a field matches nothing")
        return cls(crontab=" ".join(parts), _sets=sets)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Schedule:
        """Return the schedule stored as ``{"every_s": …}`` or ``{"crontab": …}``."""
        if data.get("crontab") is not None:
            return cls.cron(data["crontab"])
        return cls.interval(data.get("every_s"))  # type: ignore[arg-type]

    def to_json(self) -> dict[str, Any]:
        """Return the schedule as plain JSON."""
        return {"crontab": self.crontab} if self.crontab else {"every_s": self.every_s}

    def describe(self) -> str:
        """Return a short human description (``every 30 s``, ``cron 0 3 * * *``)."""
        if self.crontab:
            return f"cron {self.crontab} (UTC)"
        every = self.every_s or 0
        for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
            if every % size == 0:
                return f"every {every // size} {unit}"
        return f"every {every} s"

    def _matches(self, moment: datetime) -> bool:
        minute, hour, dom, month, dow = self._sets
        return (
            moment.month in month
            and moment.day in dom
            and (moment.weekday() + 1) % 7 in dow
            and moment.hour in hour
            and moment.minute in minute
        )

    def _next_cron(self, after_ms: int) -> int | None:
        minute, hour, dom, month, dow = self._sets
        start = datetime.fromtimestamp(after_ms // _MINUTE_MS * 60, UTC) + timedelta(minutes=1)
        day = start.replace(hour=0, minute=0)
        for _ in range(366 * 5):  # any valid expression matches within five years (Feb 29)
            if day.month in month and day.day in dom and (day.weekday() + 1) % 7 in dow:
                for h in sorted(hour):
                    for m in sorted(minute):
                        moment = day.replace(hour=h, minute=m)
                        if moment >= start:
                            return int(moment.timestamp()) * 1000
            day += timedelta(days=1)
        return None

    def next_after(self, after_ms: int) -> int | None:
        """Return the first scheduled time strictly after ``after_ms``, or None if there is none."""
        if self.every_s:
            every = self.every_s * 1000
            return (after_ms // every + 1) * every
        return self._next_cron(after_ms)

    def occurrences(self, after_ms: int, until_ms: int, limit: int = MAX_CATCH_UP) -> list[int]:
        """Return up to ``limit`` scheduled times in ``(after_ms, until_ms]``, oldest first."""
        out: list[int] = []
        if self.every_s:
            every = self.every_s * 1000
            first = (after_ms // every + 1) * every
            return list(range(first, until_ms + 1, every)[:limit])
        moment = self.next_after(after_ms)
        while moment is not None and moment <= until_ms and len(out) < limit:
            out.append(moment)
            moment = self.next_after(moment)
        return out


@dataclass(frozen=True)
class JobSettings:
    """What an operator may change: the schedule, enabled, the catch-up policy.

    ``resume_after_ms`` is set on every change: occurrences at or before it are
    never caught up (a paused or rescheduled job does not backfill).
    """

    schedule: Schedule
    enabled: bool = True
    catch_up: str = "latest"
    catch_up_window_s: int = 3600
    resume_after_ms: int = 0
    updated_by: str = "code"

    def __post_init__(self) -> None:
        if not isinstance(self.schedule, Schedule):
            raise BadType("job.schedule", "must be a Schedule")
        if not isinstance(self.enabled, bool):
            raise BadType("job.enabled", "must be true or false")
        if self.catch_up not in CATCH_UP_POLICIES:
            raise ValidationError("job.catch_up", f"must be one of {', '.join(CATCH_UP_POLICIES)}")
        _int(self.catch_up_window_s, "job.catch_up_window_s", 0, MAX_WINDOW_S)

    def to_json(self) -> dict[str, Any]:
        return {
            "schedule": self.schedule.to_json(),
            "enabled": self.enabled,
            "catch_up": self.catch_up,
            "catch_up_window_s": self.catch_up_window_s,
            "resume_after_ms": self.resume_after_ms,
            "updated_by": self.updated_by,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobSettings:
        return cls(
            schedule=Schedule.from_json(data["schedule"]),
            enabled=data["enabled"],
            catch_up=data["catch_up"],
            catch_up_window_s=data["catch_up_window_s"],
            resume_after_ms=data.get("resume_after_ms", 0),
            updated_by=data.get("updated_by", "?"),
        )


@dataclass(frozen=True)
class JobSpec:
    """A periodic task declared in code.

    ``task`` is the Celery task name; ``kwargs`` its keyword arguments; with
    ``pass_occurrence`` it also gets ``occurrence={"id", "scheduled_ms",
    "fencing_token", "attempt"}``. Every durable run can commit its effects
    fenced by the occurrence through ``occurrences.current_occurrence()``
    (``commit``, ``still_holds``): once per occurrence, never from a run that
    lost it. ``durable``
    jobs go through the occurrence ledger; the others (plain beat entries) are
    only emitted by the leader. ``lease_s`` bounds one run: a worker that dies
    mid-run is retried after it.
    """

    id: str
    task: str
    defaults: JobSettings
    kwargs: dict[str, Any] = field(default_factory=dict)
    durable: bool = True
    pass_occurrence: bool = False
    lease_s: int = 60
    description: str = ""

    def __post_init__(self) -> None:
        validate_job_id(self.id)
        if not isinstance(self.task, str) or not TASK_RE.fullmatch(self.task):
            raise ValidationError("job.task", "must be a Celery task name")
        if not isinstance(self.kwargs, dict):
            raise BadType("job.kwargs", "must be a dict")
        _int(self.lease_s, "job.lease_s", 1, MAX_LEASE_S)


@dataclass(frozen=True)
class Job:
    """A declared job with its effective settings (``version`` 0: never edited)."""

    spec: JobSpec
    settings: JobSettings
    version: int = 0

    @property
    def id(self) -> str:
        return self.spec.id

    def with_settings(self, settings: JobSettings, version: int) -> Job:
        return replace(self, settings=settings, version=version)


@dataclass(frozen=True)
class JobState:
    """What the scheduler leader has done: every occurrence up to ``considered_until_ms`` was
    emitted or deliberately skipped; ``last_emitted_ms`` is the latest emitted one."""

    considered_until_ms: int
    last_emitted_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"considered_until_ms": self.considered_until_ms, "last_emitted_ms": self.last_emitted_ms}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobState:
        return cls(data["considered_until_ms"], data.get("last_emitted_ms"))


def occurrence_id(job_id: str, scheduled_ms: int) -> str:
    """Return the deterministic id of one occurrence: ``<job id>@<scheduled ms>``."""
    return f"{job_id}@{scheduled_ms}"


def due_occurrences(
    settings: JobSettings, state: JobState | None, now_ms: int, *, grace_ms: int = ON_TIME_GRACE_MS
) -> tuple[list[int], int | None]:
    """Return ``(scheduled times to emit now, new considered_until_ms)``.

    Occurrences in ``(considered_until, now]`` are due; those older than
    ``grace_ms`` were missed and follow the catch-up policy. A job never run
    before starts ``grace_ms`` ago; a disabled job emits nothing and skips ahead.
    The second item is None when no occurrence fell due (nothing to record).
    """
    start = max(state.considered_until_ms if state else now_ms - grace_ms, settings.resume_after_ms)
    pending = settings.schedule.occurrences(start, now_ms, MAX_CATCH_UP)
    if not pending:
        return [], None
    considered = pending[-1] if len(pending) == MAX_CATCH_UP else now_ms
    if not settings.enabled:
        return [], considered
    on_time = [s for s in pending if now_ms - s <= grace_ms]
    missed = [s for s in pending if now_ms - s > grace_ms]
    if settings.catch_up == "all":
        return missed + on_time, considered
    if settings.catch_up == "latest" and missed and now_ms - missed[-1] <= settings.catch_up_window_s * 1000:
        return [missed[-1], *on_time], considered
    return on_time, considered


# -- the occurrence ledger's names (read by the services, the selectors, the beat and the tasks) ------------

OCCURRENCE_TYPE = "job.occurrence"
JOBS_CHANNEL_PREFIX = "jobs-"
SYSTEM_TENANT = "system"  # a reserved id (kv/tenant.py RESERVED_TENANT_IDS): no tenant can take it
RUN_TASK = "jobs.run"


class _SettingsSource(Protocol):
    def settings_get(self, job_id: str) -> tuple[JobSettings, int] | None: ...


def effective_job(spec: JobSpec, store: _SettingsSource) -> Job:
    """Return ``spec`` with the operator's saved settings (``store.settings_get``) applied, if any."""
    saved = store.settings_get(spec.id)
    return Job(spec, spec.defaults) if saved is None else Job(spec, saved[0], saved[1])


def jobs_channel(spec: JobSpec) -> str:
    """Return the journal channel of ``spec``'s occurrences: one per lease length (``jobs-60s``).

    A worker claims with the lease of the channel, so a run is retried only
    after its own job's lease, never while it may still be running.
    """
    return f"{JOBS_CHANNEL_PREFIX}{spec.lease_s}s"


def jobs_channels(specs: Iterable[JobSpec]) -> list[str]:
    """Return the channels of the durable jobs among ``specs``."""
    return sorted({jobs_channel(spec) for spec in specs if spec.durable})
