"""Writes of deployments: publish, gate runs, activate, rollback, prune (ARCHITECTURE §5).

``DeploymentRegistry(store, retain_versions=None)`` holds the rules; the module
functions (``version_publish``, ``gate_run_start``, …) run them over the
process-wide Kv for the API, the admin pages and tasks.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Callable, Mapping
from typing import Any

from botmesh_admin.errors import Conflict, NotFound, ValidationError
from botmesh_admin.kv.tenant import validate_id
from botmesh_admin.kv.validation import now_ms

from ..domain import (
    DECISIONS,
    FAILED,
    MAX_DETAILS,
    MAX_REASON,
    RESULTS,
    RUNNING,
    SUCCEEDED,
    ActivePointer,
    AuditEvent,
    BotVersion,
    GateBusy,
    GateNotDecidable,
    GateRun,
    GatesNotPassed,
    GateState,
    StaleGateRun,
    VersionExists,
    VersionSpec,
    new_audit_id,
    new_run_id,
    parse_version_spec,
    validate_bot,
    validate_gate,
    validate_version,
)
from ..stores.base import DeploymentStore

log = logging.getLogger(__name__)

CAS_ATTEMPTS = 20
DEFAULT_LEASE_MS = 15 * 60 * 1000
MAX_LEASE_MS = 24 * 3600 * 1000
MAX_PAGE = 200
PRUNE_BATCH = 100
RETENTION_ACTOR = "system:retention"


class DeploymentRegistry:
    """Versions, gates and the active deployment of every bot of every tenant.

    ``retain_versions`` (``None``: keep all) prunes after each publish, keeping
    the newest that many (plus the active version and any with a running gate).
    ``clock`` returns epoch milliseconds.
    """

    def __init__(
        self,
        store: DeploymentStore,
        retain_versions: int | None = None,
        *,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        if retain_versions is not None and (not isinstance(retain_versions, int) or retain_versions < 1):
            raise ValidationError("retain_versions", "must be a positive integer or None")
        self.store = store
        self.retain_versions = retain_versions
        self.clock = clock

    # ------------------------------------------------------------ helpers

    def _event(
        self, at: int, actor: str, action: str, bot: str, version: str | None = None, **detail: Any
    ) -> AuditEvent:
        return AuditEvent(
            id=new_audit_id(at),
            at=at,
            actor=actor,
            action=action,
            bot=bot,
            version=version,
            detail=detail,
        )

    @staticmethod
    def _ids(tenant: str, bot: str) -> None:
        validate_id(tenant, "tenant")
        validate_bot(bot)

    # ------------------------------------------------------------ reads

    def get(self, tenant: str, bot: str, version: str) -> BotVersion:
        """Return a retained version; raise ``NotFound`` if never published, pruned, or foreign."""
        self._ids(tenant, bot)
        validate_version(version)
        found = self.store.get_version(tenant, bot, version)
        if found is None:
            raise NotFound(f"version {version!r} of bot {bot!r} not found")
        return found

    def list(self, tenant: str, bot: str, limit: int = 50, after: int | str | None = None) -> builtins.list[BotVersion]:
        """Return up to ``limit`` (1..200) retained versions, newest first.

        ``after`` is the ``seq`` of the last version of the previous page (the
        API's ``next`` cursor); raise ``ValidationError`` for a malformed one.
        """
        self._ids(tenant, bot)
        if not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
            raise ValidationError("limit", f"must be 1..{MAX_PAGE}")
        after_seq: int | None = None
        if after is not None and after != "":
            try:
                after_seq = int(after)
            except (TypeError, ValueError):
                raise ValidationError("after", "not a cursor from a previous page") from None
        return self.store.list_versions(tenant, bot, limit=limit, after_seq=after_seq)

    def active(self, tenant: str, bot: str) -> ActivePointer | None:
        """Return the bot's active deployment, or ``None`` if none was ever activated."""
        self._ids(tenant, bot)
        return self.store.get_active(tenant, bot)

    def active_list(self, tenant: str, *, limit: int = 50, after: str | None = None) -> builtins.list[ActivePointer]:
        """Return up to ``limit`` (1..200) live deployments by bot id, bots after ``after``."""
        validate_id(tenant, "tenant")
        if not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
            raise ValidationError("limit", f"must be 1..{MAX_PAGE}")
        return self.store.list_active(tenant, limit=limit, after=after)

    def active_count(self, tenant: str) -> int:
        """Return how many bots of ``tenant`` have a live deployment."""
        validate_id(tenant, "tenant")
        return self.store.count_active(tenant)

    def bots(self, tenant: str, *, limit: int = 50, after: str | None = None) -> builtins.list[str]:
        """Return the bots of ``tenant`` that have published a version, by id."""
        validate_id(tenant, "tenant")
        return self.store.list_bots(tenant, limit=limit, after=after)

    def audit(self, tenant: str, bot: str, *, limit: int = 50, after: str | None = None) -> builtins.list[AuditEvent]:
        """Return the bot's audit trail, newest first (``after``: the last event id seen)."""
        self._ids(tenant, bot)
        return self.store.audit_list(tenant, bot, limit=limit, after=after)

    # ------------------------------------------------------------ publish

    def publish(
        self,
        tenant: str,
        spec: VersionSpec | Mapping[str, Any],
        *,
        actor: str,
        bot: str | None = None,
    ) -> tuple[BotVersion, bool]:
        """Publish a version; return ``(version, created)``.

        Publishing the same version again with the same content is a no-op
        (``created`` is False); with different content, or after it was pruned,
        it raises ``VersionExists`` (409). ``bot``, when given (the URL's), must
        match the spec's. With ``retain_versions`` set, older versions are pruned after.
        """
        validate_id(tenant, "tenant")
        if not isinstance(spec, VersionSpec):
            spec = parse_version_spec(spec)
        if bot is not None and spec.bot != bot:
            raise ValidationError("version.bot", f"{spec.bot!r} does not match the bot in the URL {bot!r}")
        digest = spec.digest
        for _ in range(CAS_ATTEMPTS):
            existing = self._existing(tenant, spec, digest)
            if existing is not None:
                return existing, False
            now = self.clock()
            fresh = BotVersion(
                spec=spec,
                seq=0,
                digest=digest,
                published_at=now,
                published_by=actor,
                gates=tuple(GateState(name=g) for g in spec.gates),
            )

            def audit(stored: BotVersion, now: int = now) -> builtins.list[AuditEvent]:
                return [
                    self._event(
                        now,
                        actor,
                        "published",
                        stored.bot,
                        stored.version,
                        seq=stored.seq,
                        digest=stored.digest,
                        artifact=stored.spec.artifact.digest,
                        gates=list(stored.spec.gates),
                    )
                ]

            try:
                stored = self.store.publish(tenant, fresh, audit=audit)
            except Conflict:
                continue  # published concurrently: compare with what won
            if self.retain_versions is not None:
                try:
                    self.prune(tenant, spec.bot, keep=self.retain_versions, actor=RETENTION_ACTOR)
                except Conflict:
                    log.warning("retention prune after publish lost a race; the next publish retries it")
            return stored, True
        raise Conflict(f"version {spec.version!r} keeps changing; try again")

    def _existing(self, tenant: str, spec: VersionSpec, digest: str) -> BotVersion | None:
        index = self.store.index_get(tenant, spec.bot, spec.version)
        if index is None:
            return None
        if index.digest != digest:
            raise VersionExists(
                f"version {spec.version!r} of {spec.bot!r} was already published with different "
                "content; versions are immutable, publish a new version",
                digest=index.digest,
            )
        if index.pruned:
            raise VersionExists(
                f"version {spec.version!r} of {spec.bot!r} was published and pruned; publish a new version",
                digest=index.digest,
            )
        found = self.store.get_version(tenant, spec.bot, spec.version)
        if found is None:  # pruned between the two reads
            raise VersionExists(f"version {spec.version!r} of {spec.bot!r} was pruned", digest=index.digest)
        return found

    # ------------------------------------------------------------ gates

    def start_gate_run(
        self,
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
        for _ in range(CAS_ATTEMPTS):
            current = self.get(tenant, bot, version)
            state = current.gate(gate)
            if state is None:
                raise NotFound(f"version {version!r} of {bot!r} has no gate {gate!r}")
            now = self.clock()
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
            events = []
            if took_over:
                events.append(
                    self._event(
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
                self._event(
                    now,
                    actor,
                    "gate_run_started",
                    bot,
                    version,
                    gate=gate,
                    run_id=run.run_id,
                    expires_at=run.expires_at,
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
            try:
                self.store.update_version(tenant, updated, expect_revision=current.revision, audit=events)
            except Conflict:
                continue  # someone else changed the version: decide again on a fresh read
            return run
        raise Conflict(f"gate {gate!r} of {version!r} keeps changing; try again")

    def finish_gate_run(
        self,
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
        """Record the ``result`` (succeeded / failed / inconclusive / error) of run ``run_id``.

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
        for _ in range(CAS_ATTEMPTS):
            current = self.get(tenant, bot, version)
            state = current.gate(gate)
            if state is None:
                raise NotFound(f"version {version!r} of {bot!r} has no gate {gate!r}")
            if state.status != RUNNING or state.run_id != run_id:
                raise StaleGateRun(
                    f"run {run_id!r} is not the current run of gate {gate!r} of {version!r}",
                    current_version=current.revision,
                )
            now = self.clock()
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
            event = self._event(
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
            try:
                return self.store.update_version(tenant, updated, expect_revision=current.revision, audit=[event])
            except Conflict:
                continue
        raise Conflict(f"gate {gate!r} of {version!r} keeps changing; try again")

    # ------------------------------------------------------------ activation

    def _point(
        self,
        tenant: str,
        bot: str,
        target: BotVersion,
        *,
        actor: str,
        kind: str,
        expected_revision: int | None,
    ) -> ActivePointer:
        if not target.gates_passed:
            waiting = [f"{g.name}={g.status}" for g in target.gates if g.status != "succeeded"]
            raise GatesNotPassed(
                f"version {target.version!r} cannot go live: not every gate succeeded ({', '.join(waiting)})",
                gates={g.name: g.status for g in target.gates},
            )
        current = self.store.get_active(tenant, bot)
        current_revision = current.revision if current else 0
        if expected_revision is not None and expected_revision != current_revision:
            raise Conflict(
                f"the active deployment of {bot!r} changed (revision {current_revision})",
                current_version=current_revision,
            )
        if current is not None and current.version == target.version:
            if kind == "rollback":
                raise ValidationError("to", f"{target.version!r} is already the active version")
            return current
        now = self.clock()
        pointer = ActivePointer(
            bot=bot,
            version=target.version,
            seq=target.seq,
            activated_at=now,
            activated_by=actor,
            kind=kind,
            previous_version=current.version if current else None,
        )
        action = "activated" if kind == "activate" else "rolled_back"
        event = self._event(
            now,
            actor,
            action,
            bot,
            target.version,
            seq=target.seq,
            previous_version=pointer.previous_version,
        )
        try:
            return self.store.set_active(
                tenant,
                pointer,
                expect_revision=current.revision if current else None,
                version=target,
                audit=[event],
            )
        except Conflict as exc:
            latest = self.store.get_active(tenant, bot)
            raise Conflict(
                f"the active deployment of {bot!r} changed concurrently; reload and retry",
                current_version=latest.revision if latest else exc.current_version,
            ) from None

    def activate(
        self,
        tenant: str,
        bot: str,
        version: str,
        *,
        actor: str,
        expected_revision: int | None = None,
    ) -> ActivePointer:
        """Make ``version`` the bot's one active deployment (compare-and-set on the pointer).

        Every gate must have succeeded (``GatesNotPassed``, 409). ``expected_revision``
        is the pointer revision the caller saw (0: none active); a concurrent
        change raises ``Conflict`` (409) — of two racing activations one wins.
        Activating the active version again is a no-op.
        """
        target = self.get(tenant, bot, version)
        return self._point(tenant, bot, target, actor=actor, kind="activate", expected_revision=expected_revision)

    def rollback(
        self, tenant: str, bot: str, *, to: str, actor: str, expected_revision: int | None = None
    ) -> ActivePointer:
        """Make the retained version ``to`` active again, recording the version it replaced.

        Raise ``NotFound`` if ``to`` was pruned or never published, ``ValidationError``
        if it is already active or nothing is active, ``GatesNotPassed`` if its gates
        have not all succeeded, ``Conflict`` on a concurrent change.
        """
        validate_version(to, "to")
        target = self.get(tenant, bot, to)
        if self.store.get_active(tenant, bot) is None:
            raise ValidationError("to", f"bot {bot!r} has no active version to roll back from")
        return self._point(tenant, bot, target, actor=actor, kind="rollback", expected_revision=expected_revision)

    # ------------------------------------------------------------ pruning

    def prune(self, tenant: str, bot: str, *, keep: int, actor: str) -> builtins.list[str]:
        """Delete versions older than the newest ``keep``; return the pruned version strings.

        The active version and versions with a running gate are never pruned
        (they are skipped). Deletions are compare-and-set on each version and on
        the active pointer, so a concurrent activation or gate start wins.
        """
        self._ids(tenant, bot)
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
            raise ValidationError("keep", "must be an integer >= 1")
        pruned: builtins.list[str] = []
        for _ in range(CAS_ATTEMPTS):
            active = self.store.get_active(tenant, bot)
            now = self.clock()
            victims = [
                v
                for v in self._older_than(tenant, bot, keep)
                if not (active and v.version == active.version) and not v.has_running_gate(now)
            ][:PRUNE_BATCH]
            if not victims:
                return pruned
            event = self._event(now, actor, "pruned", bot, None, keep=keep, versions=[v.version for v in victims])
            try:
                self.store.delete_versions(
                    tenant,
                    bot,
                    victims,
                    active_revision=active.revision if active else None,
                    audit=[event],
                )
            except Conflict:
                continue
            pruned.extend(v.version for v in victims)
        if pruned:
            return pruned
        raise Conflict(f"versions of {bot!r} keep changing; try pruning again")

    def _older_than(self, tenant: str, bot: str, keep: int) -> builtins.list[BotVersion]:
        older: builtins.list[BotVersion] = []
        seen, after = 0, None
        while True:
            page = self.store.list_versions(tenant, bot, limit=MAX_PAGE, after_seq=after)
            for v in page:
                seen += 1
                if seen > keep:
                    older.append(v)
            if len(page) < MAX_PAGE or len(older) >= PRUNE_BATCH * 2:
                return older
            after = page[-1].seq


# ---------------------------------------------------------------- module-level services


def default_registry() -> DeploymentRegistry:
    """Return a registry over the process-wide DurableKv; ``BOTMESH_RETAIN_VERSIONS`` sets retention."""
    from django.conf import settings

    from botmesh_admin.kv.runtime import default_kv

    from ..stores.kv import KvDeploymentStore

    retain = getattr(settings, "BOTMESH_RETAIN_VERSIONS", None)  # validated by config.load_tuning
    return DeploymentRegistry(KvDeploymentStore(default_kv()), int(retain) if retain else None)


def version_publish(
    tenant: str, *, spec: Mapping[str, Any] | VersionSpec, actor: str, bot: str | None = None
) -> tuple[BotVersion, bool]:
    """Publish a version (see ``DeploymentRegistry.publish``); return ``(version, created)``."""
    return default_registry().publish(tenant, spec, actor=actor, bot=bot)


def gate_run_start(
    tenant: str, bot: str, version: str, gate: str, *, actor: str, lease_ms: int = DEFAULT_LEASE_MS
) -> GateRun:
    """Reserve a gate run (see ``DeploymentRegistry.start_gate_run``)."""
    return default_registry().start_gate_run(tenant, bot, version, gate, actor=actor, lease_ms=lease_ms)


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
    """Record a gate run's result (see ``DeploymentRegistry.finish_gate_run``)."""
    return default_registry().finish_gate_run(
        tenant, bot, version, gate, run_id=run_id, result=result, details=details, actor=actor
    )


DECISION_LEASE_MS = 60_000  # the run a decision records lasts one request; a crash mid-way frees it after this


def _not_decidable(gate: str, version: str, state: GateState, current: BotVersion) -> GateNotDecidable:
    return GateNotDecidable(
        f"gate {gate!r} of {version!r} is {state.status}: a person decides only a manual gate"
        " or one whose run was inconclusive",
        current_version=current.revision,
    )


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
    validate_gate(gate)
    registry = default_registry()
    current = registry.get(tenant, bot, version)
    state = current.gate(gate)
    if state is None:
        raise NotFound(f"version {version!r} of {bot!r} has no gate {gate!r}")
    if not state.awaits_decision:
        raise _not_decidable(gate, version, state, current)
    # Checked again inside the reservation's compare-and-set: a decision landing since this read
    # (another admin, a double submit) makes this one 409, not a silent override.
    run = registry.start_gate_run(tenant, bot, version, gate, actor=actor, lease_ms=DECISION_LEASE_MS, decision=True)
    verb = "approved" if decision == "approve" else "rejected"
    decided = registry.finish_gate_run(
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


def deployment_activate(
    tenant: str, bot: str, version: str, *, actor: str, expected_revision: int | None = None
) -> ActivePointer:
    """Activate a version (see ``DeploymentRegistry.activate``)."""
    return default_registry().activate(tenant, bot, version, actor=actor, expected_revision=expected_revision)


def deployment_rollback(
    tenant: str, bot: str, *, to: str, actor: str, expected_revision: int | None = None
) -> ActivePointer:
    """Roll back to a retained version (see ``DeploymentRegistry.rollback``)."""
    return default_registry().rollback(tenant, bot, to=to, actor=actor, expected_revision=expected_revision)


def version_prune(tenant: str, bot: str, *, keep: int, actor: str) -> builtins.list[str]:
    """Prune old versions (see ``DeploymentRegistry.prune``)."""
    return default_registry().prune(tenant, bot, keep=keep, actor=actor)


__all__ = [
    "DeploymentRegistry",
    "default_registry",
    "deployment_activate",
    "deployment_rollback",
    "gate_decide",
    "gate_run_finish",
    "gate_run_start",
    "version_prune",
    "version_publish",
]
