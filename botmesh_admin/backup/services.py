"""``backup_create`` and ``backup_restore``: the two operations behind the management commands."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import logical, manifest, physical
from .layout import ROLES, Store, describe, layout, plan
from .manifest import FORMAT, FORMAT_VERSION, BackupError

logger = logging.getLogger("botmesh.backup")

# Parts are copied journal first, Kv second: a worker writes the Kv *before* it
# acks the journal record, so a journal snapshot taken first never says "done"
# for work missing from the later Kv snapshot. At worst a record is still
# leased or pending after a restore and runs again (handlers are idempotent).
BACKUP_ORDER = ("database", "journal", "kv")
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")

Say = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def _app_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("botmesh-admin")
    except PackageNotFoundError:  # pragma: no cover - running from a plain checkout
        return "unknown"


def _connect_kv(store: Store) -> Any:
    from botmesh_admin.kv import connect

    return connect(store.url)


def _connect_journal(store: Store) -> Any:
    from botmesh_admin.events import connect_journal

    return connect_journal(store.url)


@contextlib.contextmanager
def _opened(store: Store) -> Iterator[Any]:
    """Yield the process's Kv/journal for memory stores, else a fresh connection closed after."""
    if store.kind == "memory":
        # memory:// lives in this process only: the runtime's instance is the store.
        if store.role == "kv":
            from botmesh_admin.kv.runtime import default_kv

            yield default_kv()
        else:
            from botmesh_admin.events.runtime import default_journal

            yield default_journal()
        return
    opened = _connect_kv(store) if store.role == "kv" else _connect_journal(store)
    try:
        yield opened
    finally:
        opened.close()


# -- backup ------------------------------------------------------------------------------------


def _copy_part(store: Store, part: dict[str, Any], directory: Path) -> dict[str, int]:
    target = directory / part["file"]
    fmt = part["format"]
    if fmt == "sqlite":
        assert store.path is not None
        if store.role != "database" and not store.path.exists():
            with _opened(store):  # never used yet: opening it creates the empty store
                pass
        physical.sqlite_backup(store.path, target)
    elif fmt == "pg_dump":
        assert store.pg is not None
        physical.pg_dump(store.pg, target, part.get("tables"))
    elif fmt == "file":
        assert store.path is not None
        physical.snapshot_copy(store.path, target, "botmesh-kv/1" if store.role == "kv" else "botmesh-journal/1")
    else:
        with _opened(store) as opened:
            if store.role == "kv":
                return logical.kv_export(opened, target)
            return logical.journal_export(opened, target)
    return {}


def backup_create(path: str | os.PathLike[str], *, say: Say = _quiet) -> dict[str, Any]:
    """Write a backup of the database, the Kv and the journal to ``path``; return its manifest.

    ``path`` is a new (or empty) directory, or a file name ending in ``.tar``,
    ``.tar.gz`` or ``.tgz``. Runs while the installation keeps serving (see the
    package docstring for what each backend's copy guarantees). Raise
    ``BackupError`` if ``path`` exists and is not empty, or a copy fails.
    """
    from django.db import connection

    path = Path(path)
    as_tar = path.name.endswith(TAR_SUFFIXES)
    if path.exists() and (as_tar or any(path.iterdir())):
        raise BackupError(f"{path} already exists: choose a new path for the backup")
    stores = layout()
    parts = plan(stores)
    started = time.time()
    created = not as_tar and not path.exists()
    work = Path(tempfile.mkdtemp(prefix=".botmesh-backup-", dir=path.parent if as_tar else None))
    directory = work if as_tar else path
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(directory, 0o700)  # it holds password hashes and encrypted credentials
        counts: dict[str, dict[str, int]] = {}
        schema = manifest.schema_state(connection)
        for role in BACKUP_ORDER:
            part = parts[role]
            if part["format"] == "with":
                say(f"{role}: inside the {part['part']} part")
                continue
            say(f"{role}: {describe(part)} ({stores[role].kind}) -> {part['file']}")
            counts[role] = _copy_part(stores[role], part, directory)
            os.chmod(directory / part["file"], 0o600)
        doc: dict[str, Any] = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "created_at": datetime.fromtimestamp(started, UTC).isoformat().replace("+00:00", "Z"),
            "duration_s": round(time.time() - started, 3),
            "app_version": _app_version(),
            "schema": schema,
            "backends": {role: stores[role].kind for role in ROLES},
            "parts": parts,
            "counts": counts,
        }
        manifest.write(directory, doc)
        os.chmod(directory / manifest.MANIFEST, 0o600)
        if as_tar:
            partial = path.with_name(f".{path.name}.partial")
            gz = path.name.endswith((".gz", ".tgz"))
            with tarfile.open(partial, "w:gz") if gz else tarfile.open(partial, "w") as tar:
                for item in sorted(directory.iterdir()):
                    tar.add(item, arcname=item.name)
            os.replace(path.with_name(f".{path.name}.partial"), path)
            os.chmod(path, 0o600)
    except BaseException:
        if as_tar:
            path.with_name(f".{path.name}.partial").unlink(missing_ok=True)
        elif created:  # leave no half-written backup behind
            shutil.rmtree(path, ignore_errors=True)
        raise
    finally:
        if as_tar:
            shutil.rmtree(work, ignore_errors=True)
    logger.info("backup written to %s in %.1f s", path, doc["duration_s"])
    return doc


# -- restore ------------------------------------------------------------------------------------


@contextlib.contextmanager
def _unpacked(path: Path) -> Iterator[Path]:
    if path.is_dir():
        yield path
        return
    if not path.is_file():
        raise BackupError(f"{path} does not exist")
    with tempfile.TemporaryDirectory(prefix=".botmesh-restore-") as tmp:
        try:
            with tarfile.open(path) as tar:
                tar.extractall(tmp, filter="data")  # no absolute paths, links or devices
        except (tarfile.TarError, OSError) as exc:
            raise BackupError(f"{path} is not a readable backup archive: {exc}") from None
        yield Path(tmp)


def _check_layout(backup_parts: dict[str, Any], target_parts: dict[str, Any], stores: dict[str, Store]) -> None:
    for role in ROLES:
        have, want = backup_parts[role], target_parts[role]
        if have["format"] == "jsonl":
            continue  # a logical export loads into any backend
        if have["format"] != want["format"] or have.get("part") != want.get("part"):
            raise BackupError(
                f"the backup keeps the {role} as {describe(have)}, this installation as "
                f"{describe(want)} ({stores[role].variable}={stores[role].kind}): configure the same "
                "layout as the installation that wrote the backup, restore, then move data if needed"
            )


def _not_empty(stores: dict[str, Store]) -> list[str]:
    """Return what already holds data in this installation (the restore would overwrite it)."""
    from django.contrib.auth import get_user_model
    from django.db import DatabaseError, connection

    from botmesh_admin.tenancy.models import Tenant

    found = []
    try:
        if Tenant.objects.exists() or get_user_model().objects.exists():
            found.append(f"the database has {Tenant.objects.count()} tenants")
    except DatabaseError:
        pass  # no tables yet: empty
    finally:
        connection.close()
    for role in ("kv", "journal"):
        store = stores[role]
        if store.kind == "file" and store.path is not None and not store.path.exists():
            continue
        with _opened(store) as opened:
            if role == "kv" and opened.tables():
                found.append(f"the Kv ({store.variable}) has tables")
            if role == "journal" and opened.export_records(limit=1):
                found.append(f"the journal ({store.variable}) has records")
    return found


def _restore_part(role: str, store: Store, part: dict[str, Any], directory: Path, *, replace: bool) -> dict[str, int]:
    source = directory / part["file"]
    fmt = part["format"]
    if fmt == "sqlite":
        assert store.path is not None
        physical.sqlite_restore(source, store.path)
    elif fmt == "pg_dump":
        assert store.pg is not None
        physical.pg_restore(store.pg, source)
    elif fmt == "file":
        assert store.path is not None
        physical.snapshot_restore(source, store.path)
    else:
        with _opened(store) as opened:
            if role == "kv":
                if replace:
                    for table in opened.tables():
                        opened.drop(table)
                return logical.kv_import(opened, source, replace=replace)
            return logical.journal_import(opened, source)
    return {}


def backup_restore(
    path: str | os.PathLike[str], *, force: bool = False, migrate: bool = True, say: Say = _quiet
) -> dict[str, Any]:
    """Restore the backup at ``path`` into this installation; return the backup's manifest.

    Stop every web, worker and beat process first. Checks before writing
    anything: the manifest and every file's checksum, that this code knows the
    backup's schema (a newer one is refused naming the app and migration),
    that this installation keeps its stores in the same layout (a logical
    export loads into any backend), and that it is empty — unless ``force``,
    which replaces the database and the Kv tables and merges journal records.
    Then restores the database, the journal and the Kv, and runs ``migrate``
    (an older backup is brought up to this code's schema). Raise ``BackupError``.
    """
    from django.core.management import call_command
    from django.db import connection, connections

    path = Path(path)
    with _unpacked(path) as directory:
        doc = manifest.read(directory)
        manifest.check_schema(doc["schema"], connection)
        stores = layout()
        _check_layout(doc["parts"], plan(stores), stores)
        if not force and (found := _not_empty(stores)):
            raise BackupError(
                f"this installation is not empty ({'; '.join(found)}): restore into an empty one, "
                "or pass --force to replace its data"
            )
        connections.close_all()  # the database file/tables are about to be replaced
        counts: dict[str, dict[str, int]] = {}
        for role in BACKUP_ORDER:
            part = doc["parts"][role]
            if part["format"] == "with":
                continue
            say(f"{role}: restoring {describe(part)} into {stores[role].kind}")
            counts[role] = _restore_part(role, stores[role], part, directory, replace=force)
        connections.close_all()
    if migrate:
        call_command("migrate", interactive=False, verbosity=0)
    logger.info("backup from %s restored (written %s)", path, doc.get("created_at"))
    doc["restored"] = counts
    return doc
