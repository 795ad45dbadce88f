"""Reads for the replicas and jobs dashboards (HackSoft selectors)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from botmesh_admin.clock import now_ms
from botmesh_admin.errors import DomainError, NotFound

from .base import SHOWN_EVENT_KINDS, CoordinationEvent, CoordinationSnapshot, LeaderStatus, ReplicaStatus
from .domain import OCCURRENCE_TYPE, SYSTEM_TENANT, Job, JobSpec, JobState, effective_job, jobs_channel, validate_job_id
from .occurrences import SupersededRun, superseded_get_many
from .stores import job_store, system_table
from .stores.base import JobStore

FILE_LEADER_LIVE_MS = 15_000
JOURNAL_PAGES = 3


def coordination_snapshot() -> CoordinationSnapshot:
    """Return live replicas, leaders and recent lease-lost/handover events.

    Reads the keys the coordinators write (Redis, or the Kv: every web, worker
    and beat process of the embedded default heartbeats there). With the
    in-process hub (``memory:``) only this process is seen, plus the scheduler
    leader of the file-locked beat, which it publishes in the Kv.
    """
    from .runtime import coordination_url, default_coordinator

    snapshot = default_coordinator().snapshot()
    if coordination_url() != "memory:":
        return snapshot
    return _with_file_leader(snapshot)


def _with_file_leader(snapshot: CoordinationSnapshot) -> CoordinationSnapshot:
    from botmesh_admin.kv.runtime import default_kv

    kv = default_kv()
    table = system_table(kv)
    now = now_ms()
    replicas = {(r.replica_id, r.incarnation): r for r in snapshot.replicas}
    leaders = list(snapshot.leaders)
    leader_entry = kv.get(table, "leader/scheduler")
    if leader_entry is not None and now - int(leader_entry.value["at_ms"]) <= FILE_LEADER_LIVE_MS:
        info = leader_entry.value
        fence = int(info["fence"])
        leaders = [x for x in leaders if x.name != "scheduler"]
        leaders.append(LeaderStatus("scheduler", info["replica_id"], info["incarnation"], fence, -1))
        key = (info["replica_id"], info["incarnation"])
        beat = replicas.get(key)
        if beat is None:
            replicas[key] = ReplicaStatus(
                info["replica_id"],
                info["incarnation"],
                "beat",
                str(info.get("host", "?")),
                int(info.get("pid", 0)),
                max(0, now - int(info["at_ms"])),
                0,
                {"scheduler": fence},
            )
        else:
            replicas[key] = replace(beat, leads={**beat.leads, "scheduler": fence})
    return replace(snapshot, replicas=list(replicas.values()), leaders=sorted(leaders, key=lambda x: x.name))


@dataclass(frozen=True)
class OccurrenceRow:
    """One occurrence in the ledger: ``state`` pending / leased / done / dead.

    ``superseded`` lists the runs that lost the occurrence before they finished
    (a holder frozen past its lease), from the run log, oldest first.
    """

    id: str
    event_id: str
    job_id: str
    scheduled_ms: int
    state: str
    attempts: int
    last_error: str | None
    superseded: tuple[SupersededRun, ...] = ()


@dataclass(frozen=True)
class JobRow:
    """A job as the jobs page shows it."""

    job: Job
    state: JobState | None
    next_ms: int | None
    last: list[OccurrenceRow]

    @property
    def channel(self) -> str:
        return jobs_channel(self.job.spec)


def occurrence_list(
    *, job_id: str | None = None, limit: int = 50, journal: Any = None, runs: bool = True
) -> list[OccurrenceRow]:
    """Return up to ``limit`` recent occurrences (newest first), of one job or of all.

    With ``runs`` each row carries its superseded runs (one ``get_many`` of the
    run log for the rows returned).
    """
    from botmesh_admin.events import default_journal

    journal = journal or default_journal()
    rows: list[OccurrenceRow] = []
    after = None
    for _ in range(JOURNAL_PAGES):
        page = journal.list(tenant=SYSTEM_TENANT, limit=200, after=after)
        for record in page:
            if record.type != OCCURRENCE_TYPE:
                continue
            if job_id is not None and record.payload.get("job") != job_id:
                continue
            rows.append(
                OccurrenceRow(
                    record.idempotency_key,
                    record.id,
                    record.payload.get("job", "?"),
                    int(record.payload.get("scheduled_ms", 0)),
                    record.state,
                    record.attempts,
                    record.last_error,
                )
            )
        if len(page) < 200 or len(rows) >= limit:
            break
        after = page[-1].id
    rows.sort(key=lambda r: (r.scheduled_ms, r.id), reverse=True)
    return with_superseded(rows[:limit]) if runs else rows[:limit]


def with_superseded(rows: list[OccurrenceRow]) -> list[OccurrenceRow]:
    """Return ``rows`` with their superseded runs from the run log (reads O(rows) entries)."""
    from botmesh_admin.kv.runtime import default_kv

    if not rows:
        return rows
    found = superseded_get_many(default_kv(), [r.id for r in rows])
    return [replace(r, superseded=found[r.id]) if r.id in found else r for r in rows]


def _next_ms(job: Job, state: JobState | None, at_ms: int) -> int | None:
    if not job.settings.enabled:
        return None
    start = max(at_ms, state.considered_until_ms if state else 0, job.settings.resume_after_ms)
    return job.settings.schedule.next_after(start)


def job_list(
    *,
    specs: list[JobSpec] | None = None,
    store: JobStore | None = None,
    journal: Any = None,
    at_ms: int | None = None,
    last: int = 3,
) -> list[JobRow]:
    """Return every declared job with its settings, next occurrence and ``last`` recent occurrences."""
    from .registry import declared_jobs

    specs = declared_jobs() if specs is None else specs
    store = store or job_store()
    at_ms = now_ms() if at_ms is None else at_ms
    recent = occurrence_list(limit=200 * JOURNAL_PAGES, journal=journal, runs=False)
    shown = {spec.id: [r for r in recent if r.job_id == spec.id][:last] for spec in specs}
    runs = {r.id: r for r in with_superseded([r for mine in shown.values() for r in mine])}
    rows = []
    for spec in specs:
        job = effective_job(spec, store)
        state = store.state_get(spec.id)
        mine = [runs[r.id] for r in shown[spec.id]]
        rows.append(JobRow(job, state, _next_ms(job, state, at_ms), mine))
    return rows


def job_get(job_id: str, **kwargs: Any) -> JobRow:
    """Return one job's row; raise ``NotFound`` if it is not declared."""
    validate_job_id(job_id, "job_id")
    for row in job_list(**kwargs):
        if row.job.id == job_id:
            return row
    raise NotFound(f"job {job_id!r} is not declared")


# -- bots' replicas (issue 19, item 3) ---------------------------------------------------

BOT_EVENTS_SHOWN = 50
BOT_LIVE_LEASES = 3  # a replica is listed while its last heartbeat is younger than 3 of its leases


@dataclass(frozen=True)
class BotReplicas:
    """One bot's replicas as the Replicas page and API show them.

    ``replicas``: replicas whose heartbeat is younger than ``BOT_LIVE_LEASES`` of
    the replica's own ``lease_ms``, by replica id; one silent for longer than
    its ``lease_ms`` is *not responding* (``responding`` False: killed, frozen or
    cut off) and shows no turns or leaderships, since every lease it had has
    expired by then. ``leaders``: who leads each ``provider:<id>`` and the
    ``scheduler`` (fence, lease left in ms); ``turns``: chat turns held now, all
    responding replicas together (their keys only as hashes, per replica);
    ``events``: recent lease-lost, step-down and handover events, newest first.
    ``problem`` says why the state could not be read (the coordination service
    is down); the lists are empty then.
    """

    bot: str
    prefix: str
    replicas: list[ReplicaStatus]
    leaders: list[LeaderStatus]
    events: list[CoordinationEvent]
    problem: str | None = None
    silent: frozenset[tuple[str, str]] = frozenset()
    """``(replica_id, incarnation)`` of the replicas that are not responding."""

    def responding(self, replica: ReplicaStatus) -> bool:
        """Return False for a replica silent for longer than its lease."""
        return (replica.replica_id, replica.incarnation) not in self.silent

    @property
    def turns(self) -> int:
        return sum(r.turns for r in self.replicas)


def bot_list(tenant: str) -> list[str]:
    """Return the ids of the tenant's known bots, sorted, at most ``BOTMESH_METRICS_MAX_BOTS``.

    A bot is known when one of its replicas pushed a metrics snapshot that is
    still kept (``observability``'s bot registry, the Metrics page's list). A
    bot that only heartbeats is read by its id (``bot_replicas_get``): its
    prefix is a hash of tenant and bot id, so prefixes cannot be listed.
    """
    from django.conf import settings

    from botmesh_admin.observability.selectors import bot_metrics_latest

    bots = sorted({sample.bot for sample in bot_metrics_latest(tenant)})
    return bots[: int(settings.BOTMESH_METRICS_MAX_BOTS)]


def bot_replicas_get(tenant: str, bot: str) -> BotReplicas:
    """Return ``bot``'s replicas, leaders, turns and recent events, read under ``bot_prefix(tenant, bot)``.

    Only the tenant's own prefix is read: another tenant's bot of the same id
    has another prefix. Raise ``ValidationError`` naming ``tenant`` or ``bot``
    for a bad id; a coordination service that cannot be reached is reported in
    ``problem``, not raised.
    """
    from botmesh_admin.kv.tenant import validate_id
    from botmesh_admin.observability.domain import validate_bot_id

    from .base import bot_prefix
    from .bots import bot_backend
    from .runtime import coordination_settings

    validate_id(tenant, "tenant")
    validate_bot_id(bot, "bot")
    prefix = bot_prefix(tenant, bot)
    default_lease = coordination_settings()[2]
    try:
        snapshot = bot_backend(prefix).snapshot(BOT_LIVE_LEASES * max(default_lease, 60_000))
    except DomainError as exc:
        return BotReplicas(bot, prefix, [], [], [], problem=exc.message)
    replicas, silent = [], set()
    for r in snapshot.replicas:
        lease = r.lease_ms or default_lease
        if r.age_ms > BOT_LIVE_LEASES * lease:
            continue
        if r.age_ms > lease:  # its last heartbeat's turns and leaderships have expired since
            silent.add((r.replica_id, r.incarnation))
            r = replace(r, turns=0, turn_keys=(), leads={})
        replicas.append(r)
    replicas.sort(key=lambda r: (r.replica_id, r.incarnation))
    events = [e for e in snapshot.events if e.kind in SHOWN_EVENT_KINDS][:BOT_EVENTS_SHOWN]
    leaders = sorted(snapshot.leaders, key=lambda x: x.name)
    return BotReplicas(bot, prefix, replicas, leaders, events, silent=frozenset(silent))


def bot_replicas_list(tenant: str, *, bot: str | None = None) -> list[BotReplicas]:
    """Return ``bot_replicas_get`` of every known bot (``bot_list``), or of ``bot`` alone when given."""
    bots = [bot] if bot is not None else bot_list(tenant)
    return [bot_replicas_get(tenant, b) for b in bots]
