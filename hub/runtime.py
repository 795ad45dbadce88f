"""The plugin runtime the hub checks manifests against.

The default is a copy of ``fixtures/hub/runtime.json`` shipped with the package.
Override it with ``BOTMESH_HUB_RUNTIME_FILE`` (a JSON file of the same shape) and/or
``BOTMESH_HUB_RUNTIME_VERSION`` (just the version): validated at start by
``botmesh_admin.config.load_tuning`` and read from Django settings at call time
(never at import time).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import semver

from botmesh_admin.errors import ValidationError

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
    def from_dict(cls, data: Any, *, source: str = "runtime") -> RuntimeInfo:
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
    info = RuntimeInfo.from_dict(data, source="BOTMESH_HUB_RUNTIME_FILE" if path else "runtime")
    version = _setting("BOTMESH_HUB_RUNTIME_VERSION")
    if version:
        if not semver.Version.is_valid(version):
            raise ValidationError("BOTMESH_HUB_RUNTIME_VERSION", "not a SemVer 2.0 version")
        info = RuntimeInfo(version=version, known_permissions=info.known_permissions)
    return info
