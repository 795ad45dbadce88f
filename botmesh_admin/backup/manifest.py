"""``manifest.json``: what a backup holds, and whether this code can restore it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from botmesh_admin.errors import DomainError

FORMAT = "botmesh-backup"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"


class BackupError(DomainError):
    """A backup cannot be written or restored; the message says why and what to do."""

    code = "backup_error"
    status = 400


def file_digest(path: Path) -> str:
    """Return the SHA-256 hex digest of the file at ``path``."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def schema_state(connection: Any) -> dict[str, str]:
    """Return ``{app label: latest applied migration}`` of the database behind ``connection``."""
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(connection, ignore_no_migrations=True)
    applied = [key for key in loader.applied_migrations if key in loader.graph.nodes]
    latest: dict[str, tuple[int, str]] = {}
    for app, name in applied:
        # The latest is the applied migration with the most ancestors in its app.
        depth = sum(1 for a, _ in loader.graph.forwards_plan((app, name)) if a == app)
        if depth > latest.get(app, (0, ""))[0]:
            latest[app] = (depth, name)
    return {app: name for app, (_, name) in sorted(latest.items())}


def check_schema(schema: dict[str, str], connection: Any) -> None:
    """Raise ``BackupError`` unless this code knows every migration the backup's schema is at.

    A backup from an older schema is fine (``migrate`` brings it up after the
    restore); one from a newer schema would lose or misread data.
    """
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(connection, ignore_no_migrations=True)
    for app, name in sorted(schema.items()):
        if (app, name) in loader.disk_migrations:
            continue
        here = sorted(n for a, n in loader.graph.leaf_nodes() if a == app)
        known = f"the latest here is {here[-1]!r}" if here else "this version has no such app"
        raise BackupError(
            f"the backup was written by a newer schema: app {app!r} is at migration {name!r}, "
            f"which this version of botmesh-admin does not know ({known}). Upgrade botmesh-admin "
            "to the version that wrote the backup (or later), then restore."
        )


def write(directory: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest.json`` into ``directory`` (files digested first)."""
    files = {}
    for part in manifest["parts"].values():
        name = part.get("file")
        if name:
            path = directory / name
            files[name] = {"bytes": path.stat().st_size, "sha256": file_digest(path)}
    manifest["files"] = files
    text = json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False)
    (directory / MANIFEST).write_text(text + "\n", encoding="utf-8")


def read(directory: Path) -> dict[str, Any]:
    """Return the manifest of the backup in ``directory``; raise ``BackupError`` if it is not one.

    Checks the format, the format version, and the size and SHA-256 of every file.
    """
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BackupError(f"{directory} is not a botmesh-admin backup: no {MANIFEST}") from None
    except (OSError, ValueError) as exc:
        raise BackupError(f"cannot read {path}: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BackupError(f"{path} is not a botmesh-admin backup manifest")
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise BackupError(
            f"the backup has format version {version!r}; this version of botmesh-admin reads "
            f"up to {FORMAT_VERSION}: upgrade botmesh-admin first"
        )
    for key in ("schema", "parts", "files", "backends"):
        if not isinstance(manifest.get(key), dict):
            raise BackupError(f"{path}: {key!r} is missing or malformed")
    for name, meta in manifest["files"].items():
        file = directory / name
        if not file.is_file() or Path(name).name != name:
            raise BackupError(f"the backup is incomplete: {name} is missing")
        if file.stat().st_size != meta.get("bytes") or file_digest(file) != meta.get("sha256"):
            raise BackupError(f"the backup is damaged: {name} does not match its checksum")
    return manifest
