"""``/api/v1/tenants/{tenant}/bots/{bot}/versions…`` — the deployments registry (ARCHITECTURE §5, §11).

CI publishes with a tenant token (admin role); gate runners start and finish
gate runs; admins activate, roll back and prune. Reads need the agent role.
Bad input is 422 with the field path (``version.artifact.digest``); a lost
compare-and-set is 409 with ``current_version``. Times are epoch milliseconds.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema, Status

from botmesh_admin.api import (
    BodyIn,
    CursorParams,
    ErrorOut,
    Page,
    expected_version_field,
    one_of,
    principal,
    requires,
)
from botmesh_admin.clock import now_ms
from botmesh_admin.errors import NotFound
from botmesh_admin.jsonbody import json_load_object

from . import selectors, services
from .domain import DECISIONS, MAX_REASON, RESULTS, ActivePointer, BotVersion, GateRun
from .services import DEFAULT_LEASE_MS, MAX_LEASE_MS

router = Router(tags=["deployments"])

ERRORS: dict[int, type[Schema]] = {403: ErrorOut, 404: ErrorOut, 409: ErrorOut, 422: ErrorOut}


class ArtifactIO(Schema):
    digest: str = Field(..., description="sha256:<64 hex>")
    url: str = Field(..., description="oci:// or https:// URL")


class GateOut(Schema):
    name: str
    status: str = Field(..., description="pending, running, succeeded, failed, inconclusive or error")
    run_id: str | None
    runner: str | None
    started_at: int | None = Field(None, description="epoch milliseconds")
    expires_at: int | None = Field(None, description="reservation expiry, epoch milliseconds")
    finished_at: int | None = None
    details: str
    runs: int


class VersionOut(Schema):
    bot: str
    version: str
    seq: int = Field(..., description="per-bot publish sequence (1, 2, …)")
    digest: str = Field(..., description="sha256 of the canonical published content")
    artifact: ArtifactIO
    notes: str
    createdBy: str
    gates: list[GateOut]
    gate_status: str = Field(..., description="passed, failed, running or pending")
    active: bool
    published_at: int
    published_by: str
    revision: int


class ActiveOut(Schema):
    bot: str
    version: str
    seq: int
    activated_at: int
    activated_by: str
    kind: str = Field(..., description="activate or rollback")
    previous_version: str | None
    revision: int = Field(..., description="pass back as expected_version (0: nothing active)")


class GateRunIn(BodyIn):
    lease_ms: int = Field(DEFAULT_LEASE_MS, ge=1000, le=MAX_LEASE_MS, description="reservation length (ms)")


class GateRunOut(Schema):
    run_id: str
    bot: str
    version: str
    gate: str
    started_at: int
    expires_at: int
    took_over: str | None


class GateResultIn(BodyIn):
    result: str = one_of(RESULTS, description="succeeded, failed, inconclusive or error")
    details: str = ""


class GateDecisionIn(BodyIn):
    decision: str = one_of(DECISIONS, description="approve (the gate succeeds) or reject (it fails)")
    reason: str = Field(..., description=f"why, for the audit log (1-{MAX_REASON} characters)")


class ActiveRevisionIn(BodyIn):
    expected_version: int | None = expected_version_field(
        description="compare-and-set: the active pointer's revision you saw (0: none); 409 if it changed. "
        "expected_revision (its name in 0.1) is still accepted for one release"
    )


class RollbackIn(ActiveRevisionIn):
    to: str


class PruneIn(BodyIn):
    keep: int = Field(..., ge=1)


class PruneOut(Schema):
    pruned: list[str]


class DeploymentAuditOut(Schema):
    id: str
    at: int
    actor: str
    action: str
    bot: str
    version: str | None
    detail: dict[str, Any]


class BotOut(Schema):
    bot: str
    active: ActiveOut | None


class DeploymentAuditParams(CursorParams):
    after: str | None = Field(None, max_length=64)


def version_out(v: BotVersion, active: ActivePointer | None, now: int) -> dict[str, Any]:
    """Return the API shape of a version."""
    spec = v.spec.to_json()
    return {
        "bot": v.bot,
        "version": v.version,
        "seq": v.seq,
        "digest": v.digest,
        "artifact": spec["artifact"],
        "notes": spec["notes"],
        "createdBy": spec["createdBy"],
        "gates": [g.to_json() for g in v.gates],
        "gate_status": v.gate_summary(now),
        "active": bool(active and active.version == v.version),
        "published_at": v.published_at,
        "published_by": v.published_by,
        "revision": v.revision,
    }


def active_out(pointer: ActivePointer) -> dict[str, Any]:
    """Return the API shape of the active pointer."""
    return {**pointer.to_json(), "revision": pointer.revision}


def run_out(run: GateRun) -> dict[str, Any]:
    """Return the API shape of a gate run reservation."""
    return asdict(run)


def _json_body(request: HttpRequest) -> Any:
    return json_load_object(request.body or b"null", field="version", max_bytes=64 * 1024)


@router.get("bots", response={200: Page[BotOut], **ERRORS})
@requires("agent")
def bot_list(request: HttpRequest, tenant: str, page: Query[CursorParams]) -> dict[str, Any]:
    """Bots that have published, with their active version."""
    items = selectors.bot_list(tenant, limit=page.limit, after=page.after)
    return {
        "items": [{"bot": b.bot, "active": active_out(b.active) if b.active else None} for b in items],
        "next": items[-1].bot if len(items) == page.limit else None,
    }


@router.post(
    "bots/{bot}/versions",
    response={200: VersionOut, 201: VersionOut, **ERRORS},
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": "the version as CI publishes it: bot, version, artifact{digest,url}, "
            "notes, createdBy, gates[]",
            "content": {"application/json": {"schema": {"type": "object"}}},
        }
    },
)
@requires("admin")
def version_publish(request: HttpRequest, tenant: str, bot: str) -> Status:
    """Publish a version: 201 created; 200 if the same content was published before; 409 if different."""
    p = principal(request)
    version, created = services.version_publish(tenant, spec=_json_body(request), actor=p.actor, bot=bot)
    out = version_out(version, selectors.deployment_active(tenant, bot), now_ms())
    return Status(201 if created else 200, out)


@router.get("bots/{bot}/versions", response={200: Page[VersionOut], **ERRORS})
@requires("agent")
def version_list(request: HttpRequest, tenant: str, bot: str, page: Query[CursorParams]) -> dict[str, Any]:
    """Retained versions, newest first, with gate status (pass ``next`` back as ``after``)."""
    items = selectors.version_list(tenant, bot, limit=page.limit, after=page.after)
    active, now = selectors.deployment_active(tenant, bot), now_ms()
    return {
        "items": [version_out(v, active, now) for v in items],
        "next": str(items[-1].seq) if len(items) == page.limit else None,
    }


@router.get("bots/{bot}/versions/{version}", response={200: VersionOut, **ERRORS})
@requires("agent")
def version_get(request: HttpRequest, tenant: str, bot: str, version: str) -> dict[str, Any]:
    """One retained version (404 if never published, pruned, or another tenant's)."""
    v = selectors.version_get(tenant, bot, version)
    return version_out(v, selectors.deployment_active(tenant, bot), now_ms())


@router.post("bots/{bot}/versions/{version}/gates/{gate}/runs", response={201: GateRunOut, **ERRORS})
@requires("admin")
def gate_run_start(
    request: HttpRequest,
    tenant: str,
    bot: str,
    version: str,
    gate: str,
    body: GateRunIn | None = None,
) -> Status:
    """Reserve a run of ``gate``; 409 ``gate_running`` while another run holds it."""
    p = principal(request)
    lease_ms = body.lease_ms if body else DEFAULT_LEASE_MS
    run = services.gate_run_start(tenant, bot, version, gate, actor=p.actor, lease_ms=lease_ms)
    return Status(201, run_out(run))


@router.post("bots/{bot}/versions/{version}/gates/{gate}/runs/{run_id}", response={200: VersionOut, **ERRORS})
@requires("admin")
def gate_run_finish(
    request: HttpRequest,
    tenant: str,
    bot: str,
    version: str,
    gate: str,
    run_id: str,
    body: GateResultIn,
) -> dict[str, Any]:
    """Report the run's result; 409 ``stale_gate_run`` if it is not the gate's current run."""
    p = principal(request)
    v = services.gate_run_finish(
        tenant,
        bot,
        version,
        gate,
        run_id=run_id,
        result=body.result,
        details=body.details,
        actor=p.actor,
    )
    return version_out(v, selectors.deployment_active(tenant, bot), now_ms())


@router.post("bots/{bot}/versions/{version}/gates/{gate}/decision", response={200: VersionOut, **ERRORS})
@requires("admin")
def gate_decide(
    request: HttpRequest, tenant: str, bot: str, version: str, gate: str, body: GateDecisionIn
) -> dict[str, Any]:
    """Approve or reject a gate that waits for a person (a pending ``manual…`` gate, or an inconclusive run),
    with the reason; 409 ``gate_not_decidable`` for any other gate. The admin page's buttons call the same."""
    p = principal(request)
    v = services.gate_decide(tenant, bot, version, gate, decision=body.decision, reason=body.reason, actor=p.actor)
    return version_out(v, selectors.deployment_active(tenant, bot), now_ms())


@router.post("bots/{bot}/versions/{version}/activate", response={200: ActiveOut, **ERRORS})
@requires("admin")
def deployment_activate(
    request: HttpRequest, tenant: str, bot: str, version: str, body: ActiveRevisionIn | None = None
) -> dict[str, Any]:
    """Make ``version`` the active deployment; 409 ``gates_not_passed`` or on a concurrent change."""
    p = principal(request)
    pointer = services.deployment_activate(
        tenant,
        bot,
        version,
        actor=p.actor,
        expected_revision=body.expected_version if body else None,
    )
    return active_out(pointer)


@router.post("bots/{bot}/rollback", response={200: ActiveOut, **ERRORS})
@requires("admin")
def deployment_rollback(request: HttpRequest, tenant: str, bot: str, body: RollbackIn) -> dict[str, Any]:
    """Make the retained version ``to`` active again (404 if pruned); records where it came from."""
    p = principal(request)
    pointer = services.deployment_rollback(
        tenant, bot, to=body.to, actor=p.actor, expected_revision=body.expected_version
    )
    return active_out(pointer)


@router.get("bots/{bot}/active", response={200: ActiveOut, **ERRORS})
@requires("agent")
def deployment_active(request: HttpRequest, tenant: str, bot: str) -> dict[str, Any]:
    """The bot's active deployment (404 if none)."""
    pointer = selectors.deployment_active(tenant, bot)
    if pointer is None:
        raise NotFound(f"bot {bot!r} has no active deployment")
    return active_out(pointer)


@router.post("bots/{bot}/prune", response={200: PruneOut, **ERRORS})
@requires("admin")
def version_prune(request: HttpRequest, tenant: str, bot: str, body: PruneIn) -> dict[str, Any]:
    """Delete versions older than the newest ``keep`` (never the active one or one with a running gate)."""
    p = principal(request)
    return {"pruned": services.version_prune(tenant, bot, keep=body.keep, actor=p.actor)}


@router.get("bots/{bot}/audit", response={200: Page[DeploymentAuditOut], **ERRORS})
@requires("agent")
def deployment_audit(request: HttpRequest, tenant: str, bot: str, page: Query[DeploymentAuditParams]) -> dict[str, Any]:
    """Every publish, gate run, activation, rollback and prune of the bot, newest first."""
    items = selectors.deployment_audit_list(tenant, bot, limit=page.limit, after=page.after)
    return {
        "items": [e.to_json() for e in items],
        "next": items[-1].id if len(items) == page.limit else None,
    }
