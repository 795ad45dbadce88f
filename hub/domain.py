"""Plugin manifests, installations and their audit events (ARCHITECTURE §5, hub).

A manifest is untrusted JSON. ``parse_manifest`` checks the body size, that it is
one JSON object without duplicate or unknown keys, and every field's type and
format; a refusal is a ``ValidationError`` whose field path names the culprit
(``manifest.permissions[1]: unknown permission 'root:everything'``), or
``manifest: not a JSON object`` for a body that is not one.

``runtime`` is an npm-style range in a restricted grammar (below), parsed by
``node-semver`` (``nodesemver``) and checked against the running runtime's version.
The hub never runs plugin code.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import nodesemver
import semver

from botmesh_admin.errors import BadType, Conflict, ValidationError
from botmesh_admin.ids import new_audit_id as new_audit_id
from botmesh_admin.jsonbody import json_load_object, json_type
from botmesh_admin.validation import validate_text

# ---------------------------------------------------------------- the runtime
# The default is a copy of ``fixtures/hub/runtime.json`` shipped with the package. Override it with
# ``BOTMESH_HUB_RUNTIME_FILE`` (a JSON file of the same shape) and/or ``BOTMESH_HUB_RUNTIME_VERSION``
# (just the version): validated at start by ``botmesh_admin.config.load_tuning`` and read from Django
# settings at call time (never at import time).

DEFAULT_RUNTIME: dict[str, Any] = {
    "runtime_version": "1.6.2",
    "known_permissions": [
        "messages:read",
        "messages:send",
        "contacts:read",
        "contacts:write",
        "http:fetch",
        "storage:read",
        "storage:write",
        "schedule:write",
    ],
}


@dataclass(frozen=True)
class RuntimeInfo:
    """The running plugin runtime: its SemVer ``version`` and the permissions that exist."""

    version: str
    known_permissions: tuple[str, ...]

    @classmethod
    def from_json(cls, data: Any, *, source: str = "runtime") -> RuntimeInfo:
        """Build from ``{"runtime_version": str, "known_permissions": [str, ...]}``."""
        if not isinstance(data, dict):
            raise ValidationError(source, "not a JSON object")
        version = data.get("runtime_version")
        if not isinstance(version, str) or not semver.Version.is_valid(version):
            raise ValidationError(f"{source}.runtime_version", "not a SemVer 2.0 version")
        perms = data.get("known_permissions")
        if not isinstance(perms, list) or not all(isinstance(p, str) and p for p in perms):
            raise ValidationError(f"{source}.known_permissions", "must be a list of strings")
        return cls(version=version, known_permissions=tuple(dict.fromkeys(perms)))


def _setting(name: str) -> str | None:
    try:
        from django.conf import settings

        value = getattr(settings, name, None)
    except Exception:  # settings not configured (plain Python use)
        value = None
    return str(value) if value else None


def current_runtime() -> RuntimeInfo:
    """Return the configured runtime (the shipped default unless overridden)."""
    data: Any = DEFAULT_RUNTIME
    path = _setting("BOTMESH_HUB_RUNTIME_FILE")
    if path:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    info = RuntimeInfo.from_json(data, source="BOTMESH_HUB_RUNTIME_FILE" if path else "runtime")
    version = _setting("BOTMESH_HUB_RUNTIME_VERSION")
    if version:
        if not semver.Version.is_valid(version):
            raise ValidationError("BOTMESH_HUB_RUNTIME_VERSION", "not a SemVer 2.0 version")
        info = RuntimeInfo(version=version, known_permissions=info.known_permissions)
    return info


MAX_MANIFEST_BYTES = 256 * 1024
"""Largest manifest body accepted (bytes), before parsing."""
"""Control characters refused in text fields (tab and newline are allowed)."""
MAX_DESCRIPTION = 1000
MAX_NAME = 100
MAX_ID = 100
MAX_ENTRY = 200
MAX_RANGE = 256
MAX_COMPARATORS = 16

ID_RE = re.compile(r"^[a-z0-9]+(\.[a-z0-9-]+)+$")
ENTRY_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)*$")
EMAIL_RE = re.compile(r"^[^@\s<>]{1,64}@[A-Za-z0-9.-]{1,190}\.[A-Za-z]{2,}$")
URL_RE = re.compile(r"^https://[^\s<>\"]{1,300}$")

# The restricted npm range grammar: comparator sets joined by " || "; a set is a
# hyphen range "A - B" or comparators separated by one space; a comparator is an
# optional operator glued to a (partial) version. No "v" prefixes, no build
# metadata, no loose spellings. See https://github.com/npm/node-semver#ranges.
_NUM = r"(?:0|[1-9][0-9]{0,8})"
_XR = rf"(?:{_NUM}|[xX*])"
_PRE = r"(?:-[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)"
_PARTIAL = rf"{_XR}(?:\.{_XR}(?:\.{_XR}{_PRE}?)?)?"
_COMPARATOR = rf"(?:\^|~|>=|<=|>|<|=)?{_PARTIAL}"
_SET = rf"(?:{_PARTIAL} - {_PARTIAL}|{_COMPARATOR}(?: {_COMPARATOR})*)"
RANGE_RE = re.compile(rf"^{_SET}(?: \|\| {_SET})*$")

MANIFEST_FIELDS = (
    "id",
    "name",
    "version",
    "runtime",
    "permissions",
    "description",
    "entry",
    "author",
)
REQUIRED_FIELDS = ("id", "name", "version", "runtime", "permissions")
AUTHOR_FIELDS = ("name", "email", "url")


class PermissionsPending(Conflict):
    """``enable`` refused: the manifest asks for permissions an admin has not granted. HTTP 409."""

    code = "permissions_pending"


class IncompatibleRuntime(Conflict):
    """``enable`` refused: the manifest's ``runtime`` range excludes the running runtime. HTTP 409."""

    code = "incompatible_runtime"


@dataclass(frozen=True)
class Author:
    """Who publishes a plugin."""

    name: str
    email: str | None = None
    url: str | None = None

    def to_json(self) -> dict[str, str]:
        """Return the JSON form (absent fields left out)."""
        out = {"name": self.name}
        if self.email is not None:
            out["email"] = self.email
        if self.url is not None:
            out["url"] = self.url
        return out


@dataclass(frozen=True)
class Manifest:
    """A validated plugin manifest. ``permissions`` keep the manifest's order."""

    id: str
    name: str
    version: str
    runtime: str
    permissions: tuple[str, ...]
    description: str | None = None
    entry: str | None = None
    author: Author | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the canonical JSON form (optional fields left out when absent)."""
        out: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "version": self.version,
            "runtime": self.runtime,
            "permissions": list(self.permissions),
        }
        if self.description is not None:
            out["description"] = self.description
        if self.entry is not None:
            out["entry"] = self.entry
        if self.author is not None:
            out["author"] = self.author.to_json()
        return out

    @property
    def digest(self) -> str:
        """Return ``sha256:<hex>`` of the canonical JSON (sorted keys, no spaces)."""
        canonical = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    @classmethod
    def from_stored(cls, data: Mapping[str, Any]) -> Manifest:
        """Rebuild a manifest the hub validated before storing it (no re-validation)."""
        author = data.get("author")
        return cls(
            id=data["id"],
            name=data["name"],
            version=data["version"],
            runtime=data["runtime"],
            permissions=tuple(data["permissions"]),
            description=data.get("description"),
            entry=data.get("entry"),
            author=Author(**author) if author else None,
        )


# ---------------------------------------------------------------- parsing


def _text(data: Mapping[str, Any], key: str, path: str, *, max_len: int, required: bool) -> str | None:
    if key not in data:
        if required:
            raise ValidationError(path, "is required")
        return None
    return validate_text(data[key], path, max_len=max_len, blank=False, json=True)


def validate_runtime_range(value: str, path: str) -> str:
    """Return ``value`` if it is a range of the restricted grammar node-semver accepts."""
    if len(value) > MAX_RANGE:
        raise ValidationError(path, f"longer than {MAX_RANGE} characters")
    if not RANGE_RE.fullmatch(value):
        raise ValidationError(path, "not an npm semver range (e.g. '>=1.2.0 <2.0.0' or '^1.4.0')")
    if len(re.split(r" \|\| | - | ", value)) > MAX_COMPARATORS:
        raise ValidationError(path, f"more than {MAX_COMPARATORS} comparators")
    if not _range_parses(value):
        raise ValidationError(path, "not an npm semver range")
    return value


@functools.lru_cache(maxsize=1024)
def _range_parses(value: str) -> bool:
    try:
        nodesemver.make_range(value, loose=False)
    except (ValueError, TypeError):
        return False
    return True


@functools.lru_cache(maxsize=1024)
def runtime_satisfies(range_: str, version: str) -> bool:
    """Return True if runtime ``version`` lies in ``range_`` (npm semantics, pre-releases excluded)."""
    return bool(nodesemver.satisfies(version, range_, loose=False))


def _author(value: Any, path: str) -> Author:
    if isinstance(value, str):
        name = _text({"name": value}, "name", path, max_len=MAX_NAME, required=True)
        return Author(name=name or "")
    if not isinstance(value, dict):
        raise BadType(path, f"must be an object or a string, not {json_type(value)}")
    for key in value:
        if key not in AUTHOR_FIELDS:
            raise ValidationError(f"{path}.{key}", "unknown field")
    name = _text(value, "name", f"{path}.name", max_len=MAX_NAME, required=True)
    email = _text(value, "email", f"{path}.email", max_len=254, required=False)
    if email is not None and not EMAIL_RE.fullmatch(email):
        raise ValidationError(f"{path}.email", "not an email address")
    url = _text(value, "url", f"{path}.url", max_len=300, required=False)
    if url is not None and not URL_RE.fullmatch(url):
        raise ValidationError(f"{path}.url", "not an https URL")
    return Author(name=name or "", email=email, url=url)


def _permissions(value: Any, path: str, known: tuple[str, ...]) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise BadType(path, f"must be a list of permissions, not {json_type(value)}")
    if len(value) > len(known):
        raise ValidationError(path, f"more than the {len(known)} known permissions")
    seen: list[str] = []
    for i, perm in enumerate(value):
        item = f"{path}[{i}]"
        if not isinstance(perm, str):
            raise BadType(item, f"must be a string, not {json_type(perm)}")
        if perm not in known:
            raise ValidationError(item, f"unknown permission {perm[:64]!r}")
        if perm in seen:
            raise ValidationError(item, f"duplicate permission {perm!r}")
        seen.append(perm)
    return tuple(seen)


def parse_manifest(raw: bytes | str | Mapping[str, Any], *, runtime: RuntimeInfo) -> Manifest:
    """Validate an untrusted manifest (JSON bytes/text, or an already-parsed mapping).

    Raise ``ValidationError`` whose ``field`` is ``manifest`` (body not a JSON
    object, too large) or ``manifest.<path>`` (the offending field). Compatibility
    with the runtime is *not* checked here: an incompatible plugin may be installed.
    """
    path = "manifest"
    if isinstance(raw, Mapping):
        data: Mapping[str, Any] = raw
        if not isinstance(raw, dict):
            data = dict(raw)
    else:
        data = json_load_object(raw, field=path, max_bytes=MAX_MANIFEST_BYTES, reject_duplicate_keys=True)
    for key in data:
        if key not in MANIFEST_FIELDS:
            shown = key if len(key) <= 64 else key[:64] + "…"
            raise ValidationError(f"{path}.{shown}", "unknown field")
    for key in REQUIRED_FIELDS:
        if key not in data:
            raise ValidationError(f"{path}.{key}", "is required")
    plugin_id = _text(data, "id", f"{path}.id", max_len=MAX_ID, required=True) or ""
    if not ID_RE.fullmatch(plugin_id):
        raise ValidationError(f"{path}.id", "must be dotted lowercase segments like 'acme.order-status'")
    name = _text(data, "name", f"{path}.name", max_len=MAX_NAME, required=True) or ""
    version = _text(data, "version", f"{path}.version", max_len=64, required=True) or ""
    if not semver.Version.is_valid(version):
        raise ValidationError(f"{path}.version", "not a SemVer 2.0 version (e.g. '1.4.0')")
    runtime_range = _text(data, "runtime", f"{path}.runtime", max_len=MAX_RANGE, required=True) or ""
    validate_runtime_range(runtime_range, f"{path}.runtime")
    permissions = _permissions(data["permissions"], f"{path}.permissions", runtime.known_permissions)
    description = _text(data, "description", f"{path}.description", max_len=MAX_DESCRIPTION, required=False)
    entry = _text(data, "entry", f"{path}.entry", max_len=MAX_ENTRY, required=False)
    if entry is not None and (not ENTRY_RE.fullmatch(entry) or ".." in entry.split("/")):
        raise ValidationError(f"{path}.entry", "must be a relative path inside the plugin")
    author = _author(data["author"], f"{path}.author") if "author" in data else None
    return Manifest(
        id=plugin_id,
        name=name,
        version=version,
        runtime=runtime_range,
        permissions=permissions,
        description=description,
        entry=entry,
        author=author,
    )


def validate_plugin_id(value: object, path: str = "plugin_id") -> str:
    """Return ``value`` if it is a well-formed plugin id, else raise ``ValidationError``."""
    if not isinstance(value, str):
        raise BadType(path, f"must be a string, not {json_type(value)}")
    if len(value) > MAX_ID or not ID_RE.fullmatch(value):
        raise ValidationError(path, "not a plugin id")
    return value


def validate_permission_list(value: object, path: str, runtime: RuntimeInfo) -> tuple[str, ...]:
    """Return a non-empty list of distinct known permissions (a grant or revoke request)."""
    perms = _permissions(value, path, runtime.known_permissions)
    if not perms:
        raise ValidationError(path, "must name at least one permission")
    return perms


# ---------------------------------------------------------------- installations

STATUS_ENABLED = "enabled"
STATUS_DISABLED = "disabled"
STATUS_PENDING = "pending-approval"
STATUS_INCOMPATIBLE = "incompatible"


@dataclass(frozen=True)
class Installation:
    """A plugin installed in one tenant.

    ``granted`` is what an admin approved; ``enabled`` can only be true while
    ``granted`` covers every permission the manifest asks for. ``revision`` is
    the store's version of the record (compare-and-set); 0 before the first save.
    ``previous_version``/``previous_permissions`` describe the manifest the last
    install replaced (for the permission diff). Times are epoch milliseconds.
    """

    plugin_id: str
    manifest: Manifest
    digest: str
    granted: tuple[str, ...]
    enabled: bool
    installed_at: int
    installed_by: str
    updated_at: int
    previous_version: str | None = None
    previous_permissions: tuple[str, ...] = ()
    revision: int = 0

    @property
    def pending_permissions(self) -> tuple[str, ...]:
        """Requested permissions not granted yet, in manifest order."""
        return tuple(p for p in self.manifest.permissions if p not in self.granted)

    @property
    def added_permissions(self) -> tuple[str, ...]:
        """Permissions this manifest asks for that the one it replaced did not."""
        if self.previous_version is None:
            return ()
        return tuple(p for p in self.manifest.permissions if p not in self.previous_permissions)

    @property
    def removed_permissions(self) -> tuple[str, ...]:
        """Permissions the replaced manifest asked for and this one no longer does."""
        return tuple(p for p in self.previous_permissions if p not in self.manifest.permissions)

    def compatibility(self, runtime: RuntimeInfo) -> tuple[bool, str | None]:
        """Return ``(compatible, reason)`` for ``runtime``; ``reason`` explains an incompatibility."""
        if runtime_satisfies(self.manifest.runtime, runtime.version):
            return True, None
        return False, f"needs runtime {self.manifest.runtime}, running {runtime.version}"

    def status(self, runtime: RuntimeInfo) -> str:
        """Return ``enabled``, ``incompatible``, ``pending-approval`` or ``disabled``."""
        if self.enabled:
            return STATUS_ENABLED
        if not self.compatibility(runtime)[0]:
            return STATUS_INCOMPATIBLE
        if self.pending_permissions:
            return STATUS_PENDING
        return STATUS_DISABLED

    def enable_refusal(self, runtime: RuntimeInfo) -> Conflict | None:
        """Return the error ``enable`` must raise now, or ``None`` if it may enable."""
        ok, reason = self.compatibility(runtime)
        if not ok:
            return IncompatibleRuntime(
                f"{self.plugin_id} {self.manifest.version} {reason}", current_version=self.revision
            )
        pending = self.pending_permissions
        if pending:
            return PermissionsPending(
                f"{self.plugin_id} {self.manifest.version} asks for permissions not granted: " + ", ".join(pending),
                current_version=self.revision,
                pending=list(pending),
            )
        return None

    def to_json(self) -> dict[str, Any]:
        """Return the JSON record a store persists (``revision`` is the store's own)."""
        return {
            "plugin_id": self.plugin_id,
            "manifest": self.manifest.to_json(),
            "digest": self.digest,
            "granted": list(self.granted),
            "enabled": self.enabled,
            "installed_at": self.installed_at,
            "installed_by": self.installed_by,
            "updated_at": self.updated_at,
            "previous_version": self.previous_version,
            "previous_permissions": list(self.previous_permissions),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], revision: int) -> Installation:
        """Rebuild from ``to_json()`` output and the store's revision."""
        return cls(
            plugin_id=data["plugin_id"],
            manifest=Manifest.from_stored(data["manifest"]),
            digest=data["digest"],
            granted=tuple(data["granted"]),
            enabled=bool(data["enabled"]),
            installed_at=int(data["installed_at"]),
            installed_by=data["installed_by"],
            updated_at=int(data["updated_at"]),
            previous_version=data.get("previous_version"),
            previous_permissions=tuple(data.get("previous_permissions") or ()),
            revision=revision,
        )

    def evolve(self, **changes: Any) -> Installation:
        """Return a copy with ``changes`` (a frozen dataclass is never mutated)."""
        return replace(self, **changes)


AUDIT_ACTIONS = (
    "installed",
    "upgraded",
    "downgraded",
    "reinstalled",
    "granted",
    "revoked",
    "enabled",
    "disabled",
    "uninstalled",
)


@dataclass(frozen=True)
class PluginCounts:
    """How many plugins a tenant has installed, and how many of those are enabled."""

    installed: int
    enabled: int


@dataclass(frozen=True)
class AuditEvent:
    """One audited change: ``actor`` did ``action`` on ``plugin_id`` at ``at`` (epoch ms)."""

    id: str
    at: int
    actor: str
    action: str
    plugin_id: str
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Return the JSON record a store persists."""
        return {
            "id": self.id,
            "at": self.at,
            "actor": self.actor,
            "action": self.action,
            "plugin_id": self.plugin_id,
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
            plugin_id=data["plugin_id"],
            detail=dict(data.get("detail") or {}),
        )
