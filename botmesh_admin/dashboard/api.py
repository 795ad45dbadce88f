"""``/api/v1/tenants/{tenant}/`` — the Replicas page as JSON: each bot's replicas, leaders, turns, events.

The same data as ``/t/<tenant>/replicas/`` (issue 19, item 3), read through
``coordination.selectors``. A bot's state is read under
``bot_prefix(tenant, bot)`` only, so a tenant never sees another tenant's bots.
Times are milliseconds; chat keys appear only as hashes.
"""

from __future__ import annotations

from django.http import HttpRequest
from ninja import Field, Router, Schema

from botmesh_admin.api import ErrorOut, principal, requires
from botmesh_admin.coordination import selectors
from botmesh_admin.coordination.base import CoordinationEvent, LeaderStatus, ReplicaStatus
from botmesh_admin.errors import DomainError

router = Router(tags=["replicas"])


class BotReplicaOut(Schema):
    replica_id: str
    incarnation: str
    host: str
    pid: int
    heartbeat_age_ms: int
    role: str
    lease_ms: int | None
    responding: bool
    leads: dict[str, int]
    turns: int
    turn_keys: list[str]
    unreadable: list[str] = Field(
        default_factory=list,
        description="heartbeat fields of the wrong type, shown as unknown ('heartbeat': all of it)",
    )


class BotLeaderOut(Schema):
    name: str
    replica_id: str
    incarnation: str
    fence: int
    lease_left_ms: int


class CoordinationEventOut(Schema):
    kind: str
    name: str
    replica_id: str
    incarnation: str
    fence: int | None
    at_ms: int
    previous: str | None
    reason: str


class BotReplicasOut(Schema):
    bot: str
    prefix: str
    live_count: int
    """Replicas that are responding (heartbeat within their lease): the page's "N live replicas"."""
    not_responding_count: int
    """Replicas listed but silent for longer than their lease (``responding`` false: killed, frozen, cut off)."""
    replicas: list[BotReplicaOut]
    leaders: list[BotLeaderOut]
    turns: int
    events: list[CoordinationEventOut]
    problem: str | None


class AdminProcessOut(Schema):
    replica_id: str
    incarnation: str
    role: str
    host: str
    pid: int
    heartbeat_age_ms: int
    turns: int
    leads: dict[str, int]


class AdminProcessesOut(Schema):
    replicas: list[AdminProcessOut]
    leaders: list[BotLeaderOut]
    events: list[CoordinationEventOut]
    problem: str | None


class ReplicasOut(Schema):
    bots: list[BotReplicasOut]
    admin: AdminProcessesOut


def _replica_out(r: ReplicaStatus, responding: bool) -> BotReplicaOut:
    return BotReplicaOut(
        replica_id=r.replica_id,
        incarnation=r.incarnation,
        host=r.host,
        pid=r.pid,
        heartbeat_age_ms=r.age_ms,
        role=r.role,
        lease_ms=r.lease_ms,
        responding=responding,
        leads=r.leads,
        turns=r.turns,
        turn_keys=list(r.turn_keys),
        unreadable=list(r.unreadable),
    )


def _leader_out(leader: LeaderStatus) -> BotLeaderOut:
    return BotLeaderOut(
        name=leader.name,
        replica_id=leader.replica_id,
        incarnation=leader.incarnation,
        fence=leader.fence,
        lease_left_ms=leader.expires_in_ms,
    )


def _event_out(e: CoordinationEvent) -> CoordinationEventOut:
    return CoordinationEventOut(
        kind=e.kind,
        name=e.name,
        replica_id=e.replica_id,
        incarnation=e.incarnation,
        fence=e.fence,
        at_ms=e.at_ms,
        previous=e.previous,
        reason=e.detail,
    )


def _bot_out(b: selectors.BotReplicas) -> BotReplicasOut:
    replicas = [_replica_out(r, b.responding(r)) for r in b.replicas]
    live = sum(1 for r in replicas if r.responding)
    return BotReplicasOut(
        bot=b.bot,
        prefix=b.prefix,
        live_count=live,
        not_responding_count=len(replicas) - live,
        replicas=replicas,
        leaders=[_leader_out(x) for x in b.leaders],
        turns=b.turns,
        events=[_event_out(e) for e in b.events],
        problem=b.problem,
    )


def _admin_out() -> AdminProcessesOut:
    try:
        snapshot = selectors.coordination_snapshot()
    except DomainError as exc:
        return AdminProcessesOut(replicas=[], leaders=[], events=[], problem=exc.message)
    return AdminProcessesOut(
        replicas=[
            AdminProcessOut(
                replica_id=r.replica_id,
                incarnation=r.incarnation,
                role=r.role,
                host=r.host,
                pid=r.pid,
                heartbeat_age_ms=r.age_ms,
                turns=r.turns,
                leads=r.leads,
            )
            for r in snapshot.replicas
        ],
        leaders=[_leader_out(x) for x in snapshot.leaders],
        events=[_event_out(e) for e in snapshot.events[:30]],
        problem=None,
    )


@router.get("replicas", response={200: ReplicasOut})
@requires("agent")
def replicas_list(request: HttpRequest, tenant: str) -> ReplicasOut:
    """Return every known bot's replicas, leaders, turns and recent events, and the admin's own processes.

    A bot is known once one of its replicas pushed metrics (at most
    ``BOTMESH_METRICS_MAX_BOTS``); read any other bot by id with
    ``GET bots/{bot}/replicas``. ``lease_left_ms`` is -1 for a scheduler led
    through the file lock (embedded default). ``problem`` says why a
    coordination service could not be read.
    """
    principal(request)
    return ReplicasOut(bots=[_bot_out(b) for b in selectors.bot_replicas_list(tenant)], admin=_admin_out())


@router.get("bots/{anytext:bot}/replicas", response={200: BotReplicasOut, 422: ErrorOut})
@requires("agent")
def bot_replicas_get(request: HttpRequest, tenant: str, bot: str) -> BotReplicasOut:
    """Return one bot's replicas (heartbeat age, role, turns with hashed chat keys), leaders and events.

    A replica silent for longer than its ``lease_ms`` is listed with
    ``responding`` false and no turns or leaderships (they have expired) until
    three of its leases have passed.

    Read under the tenant's own prefix for ``bot``: a bot with no live replica
    answers empty lists, never another tenant's replicas.
    """
    principal(request)
    return _bot_out(selectors.bot_replicas_get(tenant, bot))
