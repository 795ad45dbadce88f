"""Writes of gates: reserve a run, record its result, a person's decision (ARCHITECTURE §5).

One run of one gate per version at a time: a run reserves the gate until its
lease expires (epoch ms from ``botmesh_admin.clock.now_ms()``); an expired
reservation is taken over (audited). Every write is a compare-and-set on the
version (``cas_retry``): a lost race re-reads and decides again.
"""

from __future__ import annotations

import logging

from botmesh_admin.clock import now_ms
from botmesh_admin.errors import NotFound, ValidationError
from botmesh_admin.kv.cas import CONTENDED_ATTEMPTS, cas_retry
from botmesh_admin.validation import validate_text

from ..domain import (
    DECISIONS,
    FAILED,
    MAX_DETAILS,
    MAX_REASON,
    RESULTS,
    RUNNING,
    SUCCEEDED,
    AuditEvent,
    BotVersion,
    GateBusy,
    GateNotDecidable,
    GateRun,
    GateState,
    StaleGateRun,
    new_run_id,
    validate_gate,
)
from ..stores import default_store
from ..stores.base import StaleRevision
from .versions import audit_event, retained_version

log = logging.getLogger(__name__)

DEFAULT_LEASE_MS = 15 * 60 * 1000
MAX_LEASE_MS = 24 * 3600 * 1000
DECISION_LEASE_MS = 60_000  # the run a decision records lasts one request; a crash mid-way frees it after this


def _gate_of(current: BotVersion, bot: str, version: str, gate: str) -> GateState:
    state = current.gate(gate)
    if state is None:
        raise NotFound(f"version {version!r} of {bot!r} has no gate {gate!r}")
    return state


def _not_decidable(gate: str, version: str, state: GateState, current: BotVersion) -> GateNotDecidable:
    return GateNotDecidable(
        f"gate {gate!r} of {version!r} is {state.status}: a person decides only a manual gate"
        " or one whose run was inconclusive",
        current_version=current.revision,
    )


def gate_run_start(
    tenant: str,
    bot: str,
    version: str,
    gate: str,
    *,
    actor: str,
    lease_ms: int = DEFAULT_LEASE_MS,
    decision: bool = False,
) -> GateRun:
    """Reserve ``gate`` of ``version`` for one run until now + ``lease_ms`` (ms).

    One run of one gate per version at a time: a live reservation raises
    ``GateBusy`` (409); an expired one is taken over (audited). Raise
    ``NotFound`` if the version does not exist or does not list ``gate``.
    ``decision`` (a person's decision, ``gate_decide``): the gate must still
    await one (``GateState.awaits_decision``) on the read the reservation's
    compare-and-set is made against, else ``GateNotDecidable`` (409) — so of
    two admins deciding at once the second is refused, never overrides.
    """
    validate_gate(gate)
    if not isinstance(lease_ms, int) or not 1000 <= lease_ms <= MAX_LEASE_MS:
        raise ValidationError("lease_ms", f"must be 1000..{MAX_LEASE_MS} milliseconds")

    def attempt() -> GateRun:
        current = retained_version(tenant, bot, version)
        state = _gate_of(current, bot, version, gate)
        now = now_ms()
        if state.running_at(now):
            raise GateBusy(
                f"gate {gate!r} of {version!r} is running ({state.run_id}) until {state.expires_at}",
                current_version=current.revision,
                run_id=state.run_id,
                expires_at=state.expires_at,
            )
        if decision and not state.awaits_decision:
            raise _not_decidable(gate, version, state, current)
        took_over = state.run_id if state.status == RUNNING else None
        run = GateRun(
            run_id=new_run_id(),
            bot=bot,
            version=version,
            gate=gate,
            started_at=now,
            expires_at=now + lease_ms,
            took_over=took_over,
        )
        events: list[AuditEvent] = []
        if took_over:
            events.append(
                audit_event(
                    now,
                    actor,
                    "gate_run_taken_over",
                    bot,
                    version,
                    gate=gate,
                    run_id=run.run_id,
                    expired_run_id=took_over,
                    expired_runner=state.runner,
                    expired_at=state.expires_at,
                )
            )
        events.append(
            audit_event(
                now, actor, "gate_run_started", bot, version, gate=gate, run_id=run.run_id, expires_at=run.expires_at
            )
        )
        updated = current.with_gate(
            GateState(
                name=gate,
                status=RUNNING,
                run_id=run.run_id,
                runner=actor,
                started_at=now,
                expires_at=run.expires_at,
                runs=state.runs + 1,
            )
        )
        default_store().update_version(tenant, updated, expect_revision=current.revision, audit=events)
        return run

    return cas_retry(attempt, what=f"gate {gate!r} of {version!r}", retry_on=StaleRevision, attempts=CONTENDED_ATTEMPTS)


def gate_run_finish(
    tenant: str,
    bot: str,
    version: str,
    gate: str,
    *,
    run_id: str,
    result: str,
    details: str = "",
    actor: str,
) -> BotVersion:
    """Record the ``result`` (succeeded / failed / inconclusive / error) of run ``run_id``; return the version.

    Raise ``StaleGateRun`` (409) if ``run_id`` is not the gate's current run
    (finished already, or taken over after its reservation expired).
    """
    validate_gate(gate)
    if result not in RESULTS:
        raise ValidationError("result", f"must be one of {', '.join(RESULTS)}")
    if not isinstance(details, str):
        raise ValidationError("details", "must be a string")
    if len(details) > MAX_DETAILS:
        raise ValidationError("details", f"longer than {MAX_DETAILS} characters")
    # audit text: no control character but tab and line feed, no bidi or zero-width disguise (as version notes)
    validate_text(details, "details", max_len=MAX_DETAILS, blank=True, allowed_controls="\t\n")

    def attempt() -> BotVersion:
        current = retained_version(tenant, bot, version)
        state = _gate_of(current, bot, version, gate)
        if state.status != RUNNING or state.run_id != run_id:
            raise StaleGateRun(
                f"run {run_id!r} is not the current run of gate {gate!r} of {version!r}",
                current_version=current.revision,
            )
        now = now_ms()
        updated = current.with_gate(
            GateState(
                name=gate,
                status=result,
                run_id=run_id,
                runner=state.runner,
                started_at=state.started_at,
                expires_at=None,
                finished_at=now,
                details=details,
                runs=state.runs,
            )
        )
        event = audit_event(
            now,
            actor,
            "gate_run_finished",
            bot,
            version,
            gate=gate,
            run_id=run_id,
            result=result,
            details=details[:500],
            duration_ms=now - (state.started_at or now),
        )
        return default_store().update_version(tenant, updated, expect_revision=current.revision, audit=[event])

    return cas_retry(attempt, what=f"gate {gate!r} of {version!r}", retry_on=StaleRevision, attempts=CONTENDED_ATTEMPTS)


def gate_decide(
    tenant: str, bot: str, version: str, gate: str, *, decision: str, reason: str, actor: str
) -> BotVersion:
    """Approve or reject a gate that waits for a person (``GateState.awaits_decision``); return the version.

    The decision is a gate run of its own, recorded by ``gate_run_start`` and
    ``gate_run_finish`` (the API's runs: the same audit events, ``actor`` the
    admin, ``details`` "approved by <actor>: <reason>"), so the audit log and
    activation's check read it like any runner's result: approve → succeeded,
    reject → failed. Raise ``ValidationError`` naming ``decision`` or ``reason``
    (required, at most ``MAX_REASON`` characters), ``NotFound`` for an unknown
    version or gate, ``GateNotDecidable`` (409) for a gate a runner decides or
    one decided already, ``GateBusy`` while a run holds it.
    """
    if decision not in DECISIONS:
        raise ValidationError("decision", f"must be one of {', '.join(DECISIONS)}")
    if not isinstance(reason, str) or not reason.strip():
        raise ValidationError("reason", "say why: the reason goes into the audit log")
    reason = reason.strip()
    if len(reason) > MAX_REASON:
        raise ValidationError("reason", f"longer than {MAX_REASON} characters")
    validate_text(reason, "reason", max_len=MAX_REASON, allowed_controls="\t\n")  # audit text, as version notes
    validate_gate(gate)
    current = retained_version(tenant, bot, version)
    state = _gate_of(current, bot, version, gate)
    if not state.awaits_decision:
        raise _not_decidable(gate, version, state, current)
    # Checked again inside the reservation's compare-and-set: a decision landing since this read
    # (another admin, a double submit) makes this one 409, not a silent override.
    run = gate_run_start(tenant, bot, version, gate, actor=actor, lease_ms=DECISION_LEASE_MS, decision=True)
    verb = "approved" if decision == "approve" else "rejected"
    decided = gate_run_finish(
        tenant,
        bot,
        version,
        gate,
        run_id=run.run_id,
        result=SUCCEEDED if decision == "approve" else FAILED,
        details=f"{verb} by {actor}: {reason}",
        actor=actor,
    )
    log.info("gate %s tenant=%s bot=%s version=%s gate=%s by=%s", verb, tenant, bot, version, gate, actor)
    return decided
