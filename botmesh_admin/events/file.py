"""FileEventJournal: the memory journal plus an atomic JSON snapshot after every change.

For one process (single-process tools, the embedded demo without workers). The
snapshot is replaced atomically — write a temporary file in the same directory,
fsync it, rename it over the snapshot, fsync the directory — so a crash leaves
the previous or the new snapshot, never a torn one. The fencing counter is part
of the snapshot and every change is durable before the call returns, so a token
is never handed out twice, also across restarts. An exclusive ``flock`` on
``<path>.lock`` keeps a second process off the file.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os

from botmesh_admin.atomicfile import write_atomic
from botmesh_admin.errors import StoreUnavailable
from botmesh_admin.kv.file import path_from_url

from .base import Clock, EventRecord, RetryPolicy
from .memory import MemoryEventJournal

FORMAT = "botmesh-journal/1"


class FileEventJournal(MemoryEventJournal):
    """EventJournal for one process, persisted to ``file:///abs/path.json``.

    Raise ``StoreUnavailable`` if another process holds the file, if the
    snapshot cannot be read, or if a write fails (memory is then reloaded from
    disk, so it never runs ahead of what is durable).
    """

    def __init__(self, url: str, *, policy: RetryPolicy | None = None, clock: Clock | None = None) -> None:
        super().__init__(url, policy=policy, clock=clock)
        self.path = path_from_url(url)
        self._tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StoreUnavailable(f"cannot open the journal lock of {self.path}: {exc}") from exc
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise StoreUnavailable(
                f"{self.path} is open in another process; FileEventJournal serves one process: "
                "use sqlite://, postgresql:// or redis:// to share a journal"
            ) from None
        self._tmp.unlink(missing_ok=True)
        self._load()

    def _load(self) -> None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            self._records, self._by_key, self._fence = {}, {}, 0
            return
        except OSError as exc:
            raise StoreUnavailable(f"cannot read {self.path}: {exc}") from exc
        try:
            doc = json.loads(raw)
            if doc.get("format") != FORMAT:
                raise ValueError(f"format is {doc.get('format')!r}, expected {FORMAT!r}")
            records = [EventRecord(**row) for row in doc["records"]]
            fence = int(doc["fence"])
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise StoreUnavailable(f"{self.path} is not a journal snapshot: {exc}") from exc
        self._records = {r.id: r for r in records}
        self._by_key = {(r.tenant, r.idempotency_key): r.id for r in records}
        self._fence = fence

    def _persist(self) -> None:
        doc = {
            "format": FORMAT,
            "fence": self._fence,
            "records": [dataclasses.asdict(r) for r in self._records.values()],
        }
        data = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
        try:
            write_atomic(self.path, data, tmp=self._tmp)
        except OSError as exc:
            self._load()
            raise StoreUnavailable(f"cannot write {self.path}: {exc}") from exc

    def close(self) -> None:
        """Release the file lock; later calls raise ``StoreUnavailable``."""
        if not self._closed:
            super().close()
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
