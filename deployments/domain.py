"""Bot versions, gates, the active pointer and the audit trail (ARCHITECTURE §5, deployments).

A version is published once and never changes content: its ``VersionSpec`` (what
CI sends) has a digest, and a second publish of the same version must carry the
same digest. What does change is the state of its gates, guarded by the
record's ``revision`` (compare-and-set). Times are epoch milliseconds.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import semver

from botmesh_admin.errors import BadType, Conflict, ValidationError
from botmesh_admin.ids import new_audit_id as new_audit_id
from botmesh_admin.jsonbody import json_type
from botmesh_admin.kv.tenant import validate_id
from botmesh_admin.validation import validate_text

GATE_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
ARTIFACT_URL_RE = re.compile(r"^(oci|https)://[A-Za-z0-9.-]+(:[0-9]{1,5})?/[^\s<>\"'\\]{1,400}$")
"""Control characters refused in text fields (tab and newline are allowed)."""
MAX_GATES = 20
MANUAL_PREFIX = "manual"  # a gate named manual… (``manual-approval``) is decided by a person, never by a runner
DECISIONS = ("approve", "reject")
MAX_REASON = 500
MAX_NOTES = 2000
MAX_CREATED_BY = 200
MAX_DETAILS = 4000
MAX_VERSION_LEN = 128

SPEC_FIELDS = ("bot", "version", "artifact", "notes", "createdBy", "gates")
REQUIRED_SPEC_FIELDS = ("bot", "version", "artifact", "gates")
ARTIFACT_FIELDS = ("digest", "url")

PENDING, RUNNING = "pending", "running"
SUCCEEDED, FAILED, INCONCLUSIVE, ERROR = "succeeded", "failed", "inconclusive", "error"
RESULTS = (SUCCEEDED, FAILED, INCONCLUSIVE, ERROR)
"""What a finished gate run reports. Only ``succeeded`` counts towards activation."""


class GatesNotPassed(Conflict):
    """Activation refused: not every gate of the version has succeeded. HTTP 409."""

    code = "gates_not_passed"


class GateBusy(Conflict):
    """A run of this gate holds an unexpired reservation on this version. HTTP 409."""

    code = "gate_running"


class StaleGateRun(Conflict):
    """The run is not (or no longer) the current run of the gate. HTTP 409."""

    code = "stale_gate_run"


class GateNotDecidable(Conflict):
    """A person may decide only a gate that waits for one (``GateState.awaits_decision``). HTTP 409."""

    code = "gate_not_decidable"


class VersionExists(Conflict):
    """The version was published before with different content (or has been pruned). HTTP 409."""

    code = "version_exists"


# ---------------------------------------------------------------- what CI publishes


def _string(data: Mapping[str, Any], key: str, path: str, *, max_len: int, required: bool) -> str | None:
    if key not in data or (data[key] is None and not required):
        if required:
            raise ValidationError(path, "is required")
        return None
    return validate_text(data[key], path, max_len=max_len, blank=True, json=True)


def _unknown_keys(data: Mapping[str, Any], allowed: tuple[str, ...], path: str) -> None:
    for key in data:
        if key not in allowed:
            raise ValidationError(f"{path}.{str(key)[:64]}", "unknown field")


@dataclass(frozen=True)
class Artifact:
    """The built bot: a content ``digest`` (``sha256:<64 hex>``) and where to fetch it."""

    digest: str
    url: str


@dataclass(frozen=True)
class VersionSpec:
    """A bot version as CI publishes it; immutable once published."""

    bot: str
    version: str
    artifact: Artifact
    gates: tuple[str, ...]
    notes: str = ""
    created_by: str = ""

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form (the publish body's field names)."""
        return {
            "bot": self.bot,
            "version": self.version,
            "artifact": {"digest": self.artifact.digest, "url": self.artifact.url},
            "notes": self.notes,
            "createdBy": self.created_by,
            "gates": list(self.gates),
        }

    @property
    def digest(self) -> str:
        """Return ``sha256:<hex>`` of the canonical JSON: equal content, equal digest."""
        canonical = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    @classmethod
    def from_stored(cls, data: Mapping[str, Any]) -> VersionSpec:
        """Rebuild a spec validated before it was stored."""
        return cls(
            bot=data["bot"],
            version=data["version"],
            artifact=Artifact(**data["artifact"]),
            gates=tuple(data["gates"]),
            notes=data.get("notes") or "",
            created_by=data.get("createdBy") or "",
        )


def validate_bot(value: object, path: str = "bot") -> str:
    """Return ``value`` if it is a bot id (the tenant id rule), else raise ``ValidationError``."""
    return validate_id(value, path)


def validate_version(value: object, path: str = "version") -> str:
    """Return ``value`` if it is a SemVer 2.0 version string, else raise ``ValidationError``."""
    if not isinstance(value, str):
        raise BadType(path, f"must be a string, not {json_type(value)}")
    if len(value) > MAX_VERSION_LEN or not semver.Version.is_valid(value):
        raise ValidationError(path, "not a SemVer 2.0 version (e.g. '1.2.0' or '2.0.0-rc.1')")
    return value


def validate_gate(value: object, path: str = "gate") -> str:
    """Return ``value`` if it is a gate name (``^[a-z0-9][a-z0-9_-]{0,62}$``)."""
    if not isinstance(value, str):
        raise BadType(path, f"must be a string, not {json_type(value)}")
    if not GATE_RE.fullmatch(value):
        raise ValidationError(path, "must be 1-63 characters of a-z, 0-9, '_' or '-'")
    return value


def parse_version_spec(data: object, *, path: str = "version") -> VersionSpec:
    """Validate a publish body (untrusted JSON, already parsed) and return its ``VersionSpec``.

    Raise ``ValidationError`` naming the field path (``version.artifact.digest: …``).
    """
    if not isinstance(data, dict):
        raise BadType(path, f"not a JSON object (got {json_type(data)})")
    _unknown_keys(data, SPEC_FIELDS, path)
    for key in REQUIRED_SPEC_FIELDS:
        if key not in data:
            raise ValidationError(f"{path}.{key}", "is required")
    bot = validate_bot(data["bot"], f"{path}.bot")
    version = validate_version(data["version"], f"{path}.version")
    artifact = data["artifact"]
    if not isinstance(artifact, dict):
        raise BadType(f"{path}.artifact", f"must be an object, not {json_type(artifact)}")
    _unknown_keys(artifact, ARTIFACT_FIELDS, f"{path}.artifact")
    digest = _string(artifact, "digest", f"{path}.artifact.digest", max_len=80, required=True) or ""
    if not DIGEST_RE.fullmatch(digest):
        raise ValidationError(f"{path}.artifact.digest", "must be 'sha256:' and 64 lowercase hex digits")
    url = _string(artifact, "url", f"{path}.artifact.url", max_len=500, required=True) or ""
    if not ARTIFACT_URL_RE.fullmatch(url):
        raise ValidationError(f"{path}.artifact.url", "must be an oci:// or https:// URL")
    gates = data["gates"]
    if not isinstance(gates, list):
        raise BadType(f"{path}.gates", f"must be a list of gate names, not {json_type(gates)}")
    if len(gates) > MAX_GATES:
        raise ValidationError(f"{path}.gates", f"more than {MAX_GATES} gates")
    for i, gate in enumerate(gates):
        validate_gate(gate, f"{path}.gates[{i}]")
        if gate in gates[:i]:
            raise ValidationError(f"{path}.gates[{i}]", f"duplicate gate {gate!r}")
    notes = _string(data, "notes", f"{path}.notes", max_len=MAX_NOTES, required=False) or ""
    created_by = _string(data, "createdBy", f"{path}.createdBy", max_len=MAX_CREATED_BY, required=False) or ""
    return VersionSpec(
        bot=bot,
        version=version,
        artifact=Artifact(digest=digest, url=url),
        gates=tuple(gates),
        notes=notes,
        created_by=created_by,
    )


# ---------------------------------------------------------------- stored state


@dataclass(frozen=True)
class GateState:
    """The state of one gate of one version.

    While ``status`` is ``running``, ``run_id`` holds the reservation until
    ``expires_at`` (epoch ms); an expired reservation may be taken over.
    """

    name: str
    status: str = PENDING
    run_id: str | None = None
    runner: str | None = None
    started_at: int | None = None
    expires_at: int | None = None
    finished_at: int | None = None
    details: str = ""
    runs: int = 0

    @property
    def awaits_decision(self) -> bool:
        """True if a person decides this gate: a pending ``manual…`` gate, or one whose run was inconclusive.

        A ``manual-approval`` gate has no runner; an ``inconclusive`` result
        (the conversation replay could not tell) never promotes by itself
        (``BotVersion.gates_passed``), so an admin approves or rejects it.
        """
        return (self.status == PENDING and self.name.startswith(MANUAL_PREFIX)) or self.status == INCONCLUSIVE

    def running_at(self, now: int) -> bool:
        """Return True if a run holds an unexpired reservation at ``now``."""
        return self.status == RUNNING and self.expires_at is not None and self.expires_at > now

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form."""
        return {
            "name": self.name,
            "status": self.status,
            "run_id": self.run_id,
            "runner": self.runner,
            "started_at": self.started_at,
            "expires_at": self.expires_at,
            "finished_at": self.finished_at,
            "details": self.details,
            "runs": self.runs,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GateState:
        """Rebuild from ``to_json()`` output."""
        return cls(**data)


@dataclass(frozen=True)
class BotVersion:
    """A published version: its spec, per-bot ``seq`` (1, 2, …), gate states and store ``revision``."""

    spec: VersionSpec
    seq: int
    digest: str
    published_at: int
    published_by: str
    gates: tuple[GateState, ...]
    revision: int = 0

    @property
    def bot(self) -> str:
        return self.spec.bot

    @property
    def version(self) -> str:
        return self.spec.version

    def gate(self, name: str) -> GateState | None:
        """Return the state of gate ``name``, or ``None`` if the version does not list it."""
        return next((g for g in self.gates if g.name == name), None)

    def with_gate(self, state: GateState) -> BotVersion:
        """Return a copy with gate ``state.name`` replaced."""
        return replace(self, gates=tuple(state if g.name == state.name else g for g in self.gates))

    @property
    def gates_passed(self) -> bool:
        """True if every gate has succeeded (``inconclusive`` never promotes)."""
        return all(g.status == SUCCEEDED for g in self.gates)

    def gate_summary(self, now: int) -> str:
        """Return ``passed``, ``failed`` (a gate failed or errored), ``running``, or ``pending``."""
        if self.gates_passed:
            return "passed"
        if any(g.status in (FAILED, ERROR) for g in self.gates):
            return "failed"
        if any(g.running_at(now) for g in self.gates):
            return "running"
        return "pending"

    def has_running_gate(self, now: int) -> bool:
        """True if any gate holds an unexpired reservation at ``now``."""
        return any(g.running_at(now) for g in self.gates)

    def to_json(self) -> dict[str, Any]:
        """Return the JSON record a store persists (``revision`` is the store's own)."""
        return {
            "spec": self.spec.to_json(),
            "seq": self.seq,
            "digest": self.digest,
            "published_at": self.published_at,
            "published_by": self.published_by,
            "gates": [g.to_json() for g in self.gates],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], revision: int) -> BotVersion:
        """Rebuild from ``to_json()`` output and the store's revision."""
        return cls(
            spec=VersionSpec.from_stored(data["spec"]),
            seq=int(data["seq"]),
            digest=data["digest"],
            published_at=int(data["published_at"]),
            published_by=data["published_by"],
            gates=tuple(GateState.from_json(g) for g in data["gates"]),
            revision=revision,
        )


@dataclass(frozen=True)
class ActivePointer:
    """Which version of ``bot`` is live. ``kind`` is ``activate`` or ``rollback``;
    ``previous_version`` is where it came from. ``revision`` guards compare-and-set."""

    bot: str
    version: str
    seq: int
    activated_at: int
    activated_by: str
    kind: str = "activate"
    previous_version: str | None = None
    revision: int = 0

    def to_json(self) -> dict[str, Any]:
        """Return the JSON record a store persists."""
        return {
            "bot": self.bot,
            "version": self.version,
            "seq": self.seq,
            "activated_at": self.activated_at,
            "activated_by": self.activated_by,
            "kind": self.kind,
            "previous_version": self.previous_version,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], revision: int) -> ActivePointer:
        """Rebuild from ``to_json()`` output and the store's revision."""
        return cls(**data, revision=revision)


@dataclass(frozen=True)
class GateRun:
    """A reservation to run ``gate`` on ``version`` until ``expires_at`` (epoch ms).

    ``run_id`` must be presented to finish the run. ``took_over`` names the
    expired run this one replaced, if any.
    """

    run_id: str
    bot: str
    version: str
    gate: str
    started_at: int
    expires_at: int
    took_over: str | None = None


@dataclass(frozen=True)
class AuditEvent:
    """One audited event of a bot: ``actor`` did ``action`` (on ``version``) at ``at`` (epoch ms)."""

    id: str
    at: int
    actor: str
    action: str
    bot: str
    version: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Return the JSON record a store persists."""
        return {
            "id": self.id,
            "at": self.at,
            "actor": self.actor,
            "action": self.action,
            "bot": self.bot,
            "version": self.version,
            "detail": self.detail,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AuditEvent:
        """Rebuild from ``to_json()`` output."""
        return cls(
            id=data["id"],
            at=int(data["at"]),
            actor=data["actor"],
            action=data["action"],
            bot=data["bot"],
            version=data.get("version"),
            detail=dict(data.get("detail") or {}),
        )


AUDIT_ACTIONS = (
    "published",
    "gate_run_started",
    "gate_run_taken_over",
    "gate_run_finished",
    "activated",
    "rolled_back",
    "pruned",
)


def new_run_id() -> str:
    """Return a fresh, unguessable gate run id."""
    return "run_" + secrets.token_hex(10)
