"""FileKv: MemoryKv plus an atomic JSON snapshot on disk after every write.

For the embedded default and single-process tools. The snapshot is replaced
atomically (write a temporary file in the same directory, fsync it, rename it
over the snapshot, fsync the directory), so a crash at any moment leaves either
the previous or the new snapshot, never a torn one. An exclusive ``flock`` on
``<path>.lock`` keeps a second process (or a second FileKv) off the same file.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import unquote, urlsplit

from botmesh_admin.atomicfile import write_atomic
from botmesh_admin.clock import now_ms
from botmesh_admin.errors import StoreUnavailable, ValidationError

from .base import Entry, Op
from .encoding import dump_value
from .memory import MemoryKv
from .validation import is_live

FORMAT = "botmesh-kv/1"


def path_from_url(url: str) -> Path:
    """Return the snapshot path of a ``file:///abs/path.json`` URL.

    Raise ``ValidationError`` (field ``url``) if the URL names no absolute path.
    """
    parts = urlsplit(url)
    path = unquote(parts.path)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost") or not path.startswith("/"):
        raise ValidationError("url", f"not a file URL with an absolute path: {url!r}")
    if path.endswith("/"):
        raise ValidationError("url", f"names a directory, not a snapshot file: {url!r}")
    return Path(path)


def _row(entry: Entry) -> str:
    expires_at = "null" if entry.expires_at is None else entry.expires_at
    return f"[{dump_value(entry.key)},{dump_value(entry.value)},{entry.version},{expires_at}]"


class FileKv(MemoryKv):
    """DurableKv for one process, persisted to a JSON snapshot after every commit.

    Every ``commit``, ``drop`` and ``sweep`` that changes something returns only
    after the new snapshot is durable. Raise ``StoreUnavailable`` if another
    process holds the file, if the snapshot cannot be read, or if a write fails
    (the in-memory state is then reloaded from disk, so it never runs ahead).
    """

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.path = path_from_url(url)
        self._tmp_path = self.path.with_name(f".{self.path.name}.tmp")
        self._chunks: dict[str, str] = {}  # serialised table, reused until it changes
        self._closed = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailable(f"cannot create the directory of {self.path}: {exc}") from exc
        self._lock_fd = self._acquire_process_lock()
        try:
            # A temporary file left by a crash is never loaded; we hold the lock, so it is stale.
            self._tmp_path.unlink(missing_ok=True)
            self._load()
        except BaseException:
            self._release_process_lock()
            raise

    # -- the process lock -------------------------------------------------------------

    def _acquire_process_lock(self) -> int:
        lock_path = f"{self.path}.lock"
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StoreUnavailable(f"cannot open lock file {lock_path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise StoreUnavailable(
                f"{self.path} is already open by another FileKv (pid {holder}); "
                "FileKv serves one process: use sqlite:// or postgresql:// to share data"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        return fd

    def _release_process_lock(self) -> None:
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        os.close(self._lock_fd)

    # -- loading and writing snapshots --------------------------------------------------

    def _load(self) -> None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StoreUnavailable(f"cannot read {self.path}: {exc}") from exc
        try:
            doc = json.loads(raw)
            if doc.get("format") != FORMAT:
                raise ValueError(f"format is {doc.get('format')!r}, expected {FORMAT!r}")
            now = now_ms()
            tables: dict[str, dict[str, Entry]] = {}
            for table, rows in doc["tables"].items():
                entries = {}
                for key, value, version, expires_at in rows:
                    entry = Entry(key, value, version, expires_at)
                    if is_live(entry, now):  # loading is a free sweep
                        entries[key] = entry
                if entries:
                    tables[table] = entries
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise StoreUnavailable(f"{self.path} is not a FileKv snapshot: {exc}") from exc
        self._tables = tables
        self._keys = {table: sorted(rows) for table, rows in tables.items()}
        self._chunks = {}

    def _chunk(self, table: str) -> str:
        chunk = self._chunks.get(table)
        if chunk is None:
            rows = self._tables[table]
            body = ",".join(_row(rows[key]) for key in self._keys[table])
            chunk = self._chunks[table] = f"{dump_value(table)}:[{body}]"
        return chunk

    def _persist(self, changed: set[str] | None) -> None:
        """Write the snapshot durably; ``changed`` lists tables to re-serialise (None: all)."""
        if changed is None:
            self._chunks.clear()
        else:
            for table in changed:
                self._chunks.pop(table, None)
        chunks = [self._chunk(t) for t, rows in self._tables.items() if rows]
        data = f'{{"format":"{FORMAT}","tables":{{{",".join(chunks)}}}}}'.encode()
        try:
            write_atomic(self.path, data, tmp=self._tmp_path)
        except OSError as exc:
            # Whatever reached the disk is the truth: reload it so memory never runs ahead.
            self._load()
            raise StoreUnavailable(f"cannot write {self.path}: {exc}") from exc

    def _check_open(self) -> None:
        if self._closed:
            raise StoreUnavailable(f"FileKv for {self.path} is closed")

    # -- the contract -------------------------------------------------------------------

    def get(self, table: str, key: str) -> Entry | None:
        """Return the live entry at ``key``, or ``None``; raise ``StoreUnavailable`` if closed."""
        self._check_open()
        return super().get(table, key)

    def get_many(self, table: str, keys: Sequence[str]) -> list[Entry | None]:
        """Return the live entry (or ``None``) of each key, in order (see the contract)."""
        self._check_open()
        return super().get_many(table, keys)

    def scan(self, table: str, prefix: str = "", after: str | None = None, limit: int = 100) -> list[Entry]:
        """Return up to ``limit`` live entries by ascending key (see the contract)."""
        self._check_open()
        return super().scan(table, prefix, after, limit)

    def scan_follow(
        self, table: str, prefix: str = "", after: str | None = None, limit: int = 100, *, field: str = "pk"
    ) -> list[tuple[Entry, Entry | None]]:
        """Return a scan's entries with the live entry each one's ``field`` names (``ScanFollow``)."""
        self._check_open()
        return super().scan_follow(table, prefix, after, limit, field=field)

    def commit(self, table: str, ops: Sequence[Op]) -> list[Entry | None]:
        """Apply ``ops`` atomically and return after the snapshot is on disk.

        Raise ``ConflictError`` or ``ValidationError`` (a refused ``Add``; nothing
        written) or ``StoreUnavailable`` (the write failed; nothing of the batch is kept).
        """
        with self._lock:
            self._check_open()
            results = super().commit(table, ops)
            self._persist({table})
            return results

    def drop(self, table: str) -> None:
        """Delete every entry of ``table`` and persist the snapshot."""
        with self._lock:
            self._check_open()
            existed = table in self._tables
            super().drop(table)
            if existed:
                self._persist({table})

    def sweep(self, limit: int = 1000) -> int:
        """Remove up to ``limit`` expired entries, persist, and return how many."""
        with self._lock:
            self._check_open()
            removed = super().sweep(limit)
            if removed:
                self._persist(None)
            return removed

    def tables(self, prefix: str = "") -> list[str]:
        """Return the tables starting with ``prefix`` that hold a live entry, by name."""
        self._check_open()
        return super().tables(prefix)

    def import_entries(self, table: str, entries: Sequence[Entry]) -> int:
        """Store ``entries`` as given (restore) and return after the snapshot is on disk."""
        with self._lock:
            self._check_open()
            stored = super().import_entries(table, entries)
            self._persist({table})
            return stored

    def ping(self) -> None:
        """Raise ``StoreUnavailable`` if this FileKv is closed."""
        self._check_open()

    def close(self) -> None:
        """Release the process lock; the instance is unusable afterwards."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._release_process_lock()


__all__ = ["FileKv"]
