"""Copies of whole files and databases: SQLite, file snapshots, PostgreSQL dumps."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

from .layout import PgTarget
from .manifest import BackupError

PG_TIMEOUT_S = 6 * 3600


# -- SQLite ------------------------------------------------------------------------------


def sqlite_backup(source: Path, target: Path) -> None:
    """Copy the SQLite database ``source`` to ``target`` with the online backup API.

    Other processes may keep writing: the copy is one consistent snapshot (one
    read transaction; WAL readers never block writers). The copy is left in
    rollback-journal mode so it is one self-contained file, and checked.
    """
    if not source.is_file():
        raise BackupError(f"the SQLite database {source} does not exist")
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=30)
    dst = sqlite3.connect(target)
    try:
        src.backup(dst)  # pages=-1: the whole database in one step, so one snapshot
        dst.execute("PRAGMA journal_mode=DELETE")
        ok = dst.execute("PRAGMA quick_check").fetchone()[0]
    except sqlite3.Error as exc:
        raise BackupError(f"SQLite backup of {source} failed: {exc}") from None
    finally:
        src.close()
        dst.close()
    if ok != "ok":
        raise BackupError(f"the SQLite copy of {source} fails its check: {ok}")


def sqlite_restore(source: Path, target: Path) -> None:
    """Replace the content of the SQLite database ``target`` with the backup file ``source``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    dst = sqlite3.connect(target, timeout=30)
    try:
        src.backup(dst)
        dst.execute("PRAGMA journal_mode=WAL")  # what every botmesh process opens it with
    except sqlite3.Error as exc:
        raise BackupError(f"SQLite restore into {target} failed: {exc}") from None
    finally:
        src.close()
        dst.close()


# -- file snapshots (FileKv, FileEventJournal) -------------------------------------------


def snapshot_copy(source: Path, target: Path, fmt: str) -> None:
    """Copy the snapshot file ``source`` (format ``fmt``) to ``target``.

    Its owner replaces the file by an atomic rename, so the one ``open`` here
    reads a whole snapshot even while the owner writes. A missing file is an
    empty store (nothing was written yet).
    """
    try:
        data = source.read_bytes()
    except FileNotFoundError:
        data = json.dumps({"format": fmt, "tables": {}} if "kv" in fmt else
                          {"format": fmt, "fence": 0, "records": []}).encode()  # fmt: skip
    try:
        if json.loads(data).get("format") != fmt:
            raise ValueError(f"format is not {fmt}")
    except ValueError as exc:
        raise BackupError(f"{source} is not a {fmt} snapshot: {exc}") from None
    target.write_bytes(data)


@contextlib.contextmanager
def _file_lock(path: Path):  # type: ignore[no-untyped-def]
    """Hold the owner's ``<path>.lock`` so no process opens the store while it is replaced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BackupError(
                f"{path} is open in a running process: stop the web, worker and beat processes before a restore"
            ) from None
        yield
    finally:
        os.close(fd)


def snapshot_restore(source: Path, target: Path) -> None:
    """Put the snapshot ``source`` in place of ``target`` atomically (fsync, rename, fsync dir)."""
    with _file_lock(target):
        tmp = target.with_name(f".{target.name}.restore")
        shutil.copyfile(source, tmp)
        with tmp.open("rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, target)
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


# -- PostgreSQL ----------------------------------------------------------------------------


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise BackupError(
            f"{name} is not installed: install the PostgreSQL client of your server's major "
            "version (Debian: apt-get install postgresql-client)"
        )
    return path


def _run(args: list[str], pg: PgTarget, what: str) -> None:
    proc = subprocess.run(args, env=pg.env(), capture_output=True, text=True, timeout=PG_TIMEOUT_S)
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise BackupError(f"{what} failed: {' / '.join(detail[-3:]) or f'exit {proc.returncode}'}")


def pg_dump(pg: PgTarget, target: Path, tables: list[str] | None = None) -> None:
    """Dump database ``pg`` (or only ``tables``) in custom format to ``target`` (one snapshot)."""
    args = [_tool("pg_dump"), "--format=custom", "--no-owner", "--no-privileges", f"--file={target}"]
    args += [f"--table={t}" for t in tables or ()]
    _run([*args, f"--dbname={pg.conninfo()}"], pg, f"pg_dump of database {pg.dbname!r}")


def pg_restore(pg: PgTarget, source: Path) -> None:
    """Restore the custom-format dump ``source`` into database ``pg``, replacing what it holds.

    One transaction: either the whole dump is in, or nothing changed.
    """
    args = [_tool("pg_restore"), "--clean", "--if-exists", "--no-owner", "--no-privileges",
            "--single-transaction", "--exit-on-error", f"--dbname={pg.conninfo()}", str(source)]  # fmt: skip
    _run(args, pg, f"pg_restore into database {pg.dbname!r}")
