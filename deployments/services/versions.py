"""Writes of versions and the active pointer: publish, activate, rollback, prune (ARCHITECTURE §5).

Versions are immutable (publishing the same version twice with different
content is refused); exactly one deployment per (tenant, bot) is active. The
store is ``stores.default_store()``, the time ``botmesh_admin.clock.now_ms()``
(epoch ms); ``BOTMESH_RETAIN_VERSIONS`` (``retain_versions()``) prunes after
each publish.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from botmesh_admin.clock import now_ms
from botmesh_admin.errors import Conflict, NotFound, ValidationError
from botmesh_admin.kv.cas import CONTENDED_ATTEMPTS, cas_retry
from botmesh_admin.kv.tenant import validate_id
from botmesh_admin.pagination import MAX_PAGE

from ..domain import (
    ActivePointer,
    AuditEvent,
    BotVersion,
    GatesNotPassed,
    GateState,
    VersionExists,
    VersionSpec,
    new_audit_id,
    parse_version_spec,
    validate_bot,
    validate_version,
)
from ..stores import default_store
from ..stores.base import StaleRevision

log = logging.getLogger(__name__)

PRUNE_BATCH = 100
PRUNE_ROUNDS = 20
"""Batches one ``version_prune`` call deletes at most (``PRUNE_BATCH`` versions each)."""
RETENTION_ACTOR = "system:retention"


def retain_versions() -> int | None:
    """Return how many versions a publish keeps (``BOTMESH_RETAIN_VERSIONS``), ``None`` for all.

    Read from the settings at call time (validated at start by ``config.load_tuning``).
    """
    from django.conf import settings

    retain = getattr(settings, "BOTMESH_RETAIN_VERSIONS", None)
    return int(retain) if retain else None


def audit_event(at: int, actor: str, action: str, bot: str, version: str | None = None, **detail: Any) -> AuditEvent:
    """Return the audit event of ``action`` at ``at`` (epoch ms) by ``actor``."""
    return AuditEvent(id=new_audit_id(at), at=at, actor=actor, action=action, bot=bot, version=version, detail=detail)


def retained_version(tenant: str, bot: str, version: str) -> BotVersion:
    """Return a retained version for a write; raise ``NotFound`` if never published, pruned, or foreign."""
    validate_id(tenant, "tenant")
    validate_bot(bot)
    validate_version(version)
    found = default_store().get_version(tenant, bot, version)
    if found is None:
        raise NotFound(f"version {version!r} of bot {bot!r} not found")
    return found


# ------------------------------------------------------------ publish


def version_publish(
    tenant: str, *, spec: VersionSpec | Mapping[str, Any], actor: str, bot: str | None = None
) -> tuple[BotVersion, bool]:
    """Publish a version; return ``(version, created)``.

    Publishing the same version again with the same content is a no-op
    (``created`` is False); with different content, or after it was pruned,
    it raises ``VersionExists`` (409). ``bot``, when given (the URL's), must
    match the spec's. With ``retain_versions()`` set, older versions are pruned after.
    """
    validate_id(tenant, "tenant")
    if not isinstance(spec, VersionSpec):
        spec = parse_version_spec(spec)
    if bot is not None and spec.bot != bot:
        raise ValidationError("version.bot", f"{spec.bot!r} does not match the bot in the URL {bot!r}")
    parsed, digest = spec, spec.digest

    def attempt() -> tuple[BotVersion, bool]:
        existing = _existing(tenant, parsed, digest)
        if existing is not None:
            return existing, False
        now = now_ms()
        fresh = BotVersion(
            spec=parsed,
            seq=0,
            digest=digest,
            published_at=now,
            published_by=actor,
            gates=tuple(GateState(name=g) for g in parsed.gates),
        )

        def audit(stored: BotVersion) -> list[AuditEvent]:
            return [
                audit_event(
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

        # Published concurrently (StaleRevision): the next attempt compares with what won.
        return default_store().publish(tenant, fresh, audit=audit), True

    stored, created = cas_retry(
        attempt, what=f"version {spec.version!r}", retry_on=StaleRevision, attempts=CONTENDED_ATTEMPTS
    )
    keep = retain_versions()
    if created and keep is not None:
        try:
            version_prune(tenant, spec.bot, keep=keep, actor=RETENTION_ACTOR)
        except Conflict:
            log.warning("retention prune after publish lost a race; the next publish retries it")
    return stored, created


def _existing(tenant: str, spec: VersionSpec, digest: str) -> BotVersion | None:
    store = default_store()
    index = store.index_get(tenant, spec.bot, spec.version)
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
    found = store.get_version(tenant, spec.bot, spec.version)
    if found is None:  # pruned between the two reads
        raise VersionExists(f"version {spec.version!r} of {spec.bot!r} was pruned", digest=index.digest)
    return found


# ------------------------------------------------------------ activation


def _point(
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
    store = default_store()
    current = store.get_active(tenant, bot)
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
    now = now_ms()
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
    event = audit_event(
        now, actor, action, bot, target.version, seq=target.seq, previous_version=pointer.previous_version
    )
    try:
        return store.set_active(
            tenant,
            pointer,
            expect_revision=current.revision if current else None,
            version=target,
            audit=[event],
        )
    except StaleRevision as exc:
        # Of two racing activations one wins; the other is told, never retried over it.
        latest = store.get_active(tenant, bot)
        raise Conflict(
            f"the active deployment of {bot!r} changed concurrently; reload and retry",
            current_version=latest.revision if latest else exc.current_version,
        ) from None


def deployment_activate(
    tenant: str, bot: str, version: str, *, actor: str, expected_revision: int | None = None
) -> ActivePointer:
    """Make ``version`` the bot's one active deployment (compare-and-set on the pointer).

    Every gate must have succeeded (``GatesNotPassed``, 409). ``expected_revision``
    is the pointer revision the caller saw (0: none active); a concurrent
    change raises ``Conflict`` (409) — of two racing activations one wins.
    Activating the active version again is a no-op.
    """
    target = retained_version(tenant, bot, version)
    return _point(tenant, bot, target, actor=actor, kind="activate", expected_revision=expected_revision)


def deployment_rollback(
    tenant: str, bot: str, *, to: str, actor: str, expected_revision: int | None = None
) -> ActivePointer:
    """Make the retained version ``to`` active again, recording the version it replaced.

    Raise ``NotFound`` if ``to`` was pruned or never published, ``ValidationError``
    if it is already active or nothing is active, ``GatesNotPassed`` if its gates
    have not all succeeded, ``Conflict`` on a concurrent change.
    """
    validate_version(to, "to")
    target = retained_version(tenant, bot, to)
    if default_store().get_active(tenant, bot) is None:
        raise ValidationError("to", f"bot {bot!r} has no active version to roll back from")
    return _point(tenant, bot, target, actor=actor, kind="rollback", expected_revision=expected_revision)


# ------------------------------------------------------------ pruning


def version_prune(tenant: str, bot: str, *, keep: int, actor: str) -> list[str]:
    """Delete versions older than the newest ``keep``; return the pruned version strings.

    The active version and versions with a running gate are never pruned
    (they are skipped). Deletions are compare-and-set on each version and on
    the active pointer, so a concurrent activation or gate start wins (the batch
    is decided again). At most ``PRUNE_ROUNDS`` batches of ``PRUNE_BATCH`` per call.
    """
    validate_id(tenant, "tenant")
    validate_bot(bot)
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
        raise ValidationError("keep", "must be an integer >= 1")
    store = default_store()

    def prune_batch() -> list[str]:
        active = store.get_active(tenant, bot)
        now = now_ms()
        victims = [
            v
            for v in _older_than(tenant, bot, keep)
            if not (active and v.version == active.version) and not v.has_running_gate(now)
        ][:PRUNE_BATCH]
        if victims:
            event = audit_event(now, actor, "pruned", bot, None, keep=keep, versions=[v.version for v in victims])
            store.delete_versions(
                tenant, bot, victims, active_revision=active.revision if active else None, audit=[event]
            )
        return [v.version for v in victims]

    pruned: list[str] = []
    for _ in range(PRUNE_ROUNDS):
        try:
            batch = cas_retry(
                prune_batch,
                what=f"versions of {bot!r}",
                retry_on=StaleRevision,
                exhausted=lambda: Conflict(f"versions of {bot!r} keep changing; try pruning again"),
            )
        except Conflict:
            if pruned:
                return pruned  # what was pruned stays pruned; the rest waits for the next call
            raise
        if not batch:
            break
        pruned.extend(batch)
    return pruned


def _older_than(tenant: str, bot: str, keep: int) -> list[BotVersion]:
    older: list[BotVersion] = []
    seen, after = 0, None
    while True:
        page = default_store().list_versions(tenant, bot, limit=MAX_PAGE, after_seq=after)
        for v in page:
            seen += 1
            if seen > keep:
                older.append(v)
        if len(page) < MAX_PAGE or len(older) >= PRUNE_BATCH * 2:
            return older
        after = page[-1].seq
