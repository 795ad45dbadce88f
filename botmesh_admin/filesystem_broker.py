"""The embedded default's Celery broker: kombu's filesystem transport, safe on a full disk.

Selected by ``settings.CELERY_BROKER_TRANSPORT`` when ``CELERY_BROKER_URL`` is
``filesystem://`` (the URL stays kombu's). Each message is one file in the
queue folder; kombu's own transport (``kombu.transport.filesystem``) breaks on
a full disk in two ways this one does not (issue 17, item 5):

- **Writes are atomic.** kombu opens the message file under its final name and
  then writes it: when the write fails (``ENOSPC``) a zero-byte message stays
  in the queue. Here a message is written under a name no consumer reads
  (``.partial-…``) and renamed into place once complete, and a failed write
  leaves nothing behind. Exchange tables (``control/*.exchange``) likewise.
- **A corrupt message is set aside, never fatal.** kombu's consumer raised
  ``JSONDecodeError`` on an empty or truncated file — the worker crashed, and
  again on every restart, until the file was deleted by hand. Here such a file
  (empty, not JSON, not a message envelope) is moved into the ``corrupt``
  folder (transport option ``corrupt_folder``; default: ``corrupt`` next to
  the queue folder) with a warning naming it, and the next message is taken.
  A corrupt exchange table is set aside the same way and rebuilt by the next bind.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from queue import Empty
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

log = logging.getLogger("botmesh.broker")

PARTIAL_PREFIX = ".partial-"


def decode_message(raw: bytes) -> dict[str, Any] | None:
    """Return the message envelope in ``raw``, or ``None`` if it is empty, not JSON or not an envelope."""
    try:
        payload = loads(bytes_to_str(raw))
    except ValueError:  # JSONDecodeError, UnicodeDecodeError (both ValueErrors); "" is one too
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("properties"), dict):
        return None
    return payload


def write_atomically(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename; on failure leave no file.

    Raise ``OSError`` (say ``ENOSPC``) when the write fails.
    """
    path = Path(path)
    partial = path.with_name(f"{PARTIAL_PREFIX}{uuid.uuid4().hex}")
    try:
        with open(partial, "wb") as out:
            out.write(data)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(partial)
        raise


def set_aside(path: str | Path, folder: str | Path, why: str) -> None:
    """Move the broker file at ``path`` into ``folder`` and log it; delete it if it cannot be moved."""
    path = Path(path)
    target = Path(folder) / path.name
    try:
        os.makedirs(folder, exist_ok=True)
        shutil.move(str(path), str(target))
        log.warning("broker file %s is %s: moved to %s (it is not retried)", path.name, why, target)
    except OSError as exc:  # the disk is full even for a rename: the file must go all the same
        with contextlib.suppress(OSError):
            os.remove(path)
        log.warning("broker file %s is %s and could not be moved aside (%s): deleted", path.name, why, exc.strerror)


def _what_is_wrong(raw: bytes) -> str:
    return "empty" if not raw.strip() else f"not a valid message ({len(raw)} bytes)"


class Channel(filesystem.Channel):
    """kombu's filesystem channel with atomic writes and corrupt files set aside."""

    @property
    def corrupt_folder(self) -> str:
        """Where corrupt files go (transport option ``corrupt_folder``)."""
        default = os.path.join(os.path.dirname(os.path.abspath(self.data_folder_in)), "corrupt")
        return str(self.transport_options.get("corrupt_folder", default))

    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        """Put ``payload`` onto ``queue`` as one complete file (kombu's file name, so the order is kombu's)."""
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        path = os.path.join(self.data_folder_out, name)
        try:
            write_atomically(path, str_to_bytes(dumps(payload)))
        except OSError as exc:
            raise ChannelError(f"Cannot add file {path!r} to directory: {exc.strerror}") from exc

    def _get(self, queue: str) -> Any:
        """Take the oldest readable message of ``queue``; set corrupt ones aside on the way."""
        wanted = f".{queue}.msg"
        claim_folder = self.processed_folder if os.path.isdir(self.processed_folder) else tempfile.gettempdir()
        for filename in sorted(os.listdir(self.data_folder_in)):
            if filename.find(wanted) < 0:
                continue
            claimed = os.path.join(claim_folder, filename)
            try:  # the move is the claim: of several consumers, one wins
                shutil.move(os.path.join(self.data_folder_in, filename), claimed)
            except OSError:
                continue  # taken by another consumer meanwhile
            try:
                with open(claimed, "rb") as source:
                    raw = source.read()
            except OSError as exc:
                raise ChannelError(f"Cannot read file {claimed!r} from queue.") from exc
            payload = decode_message(raw)
            if payload is None:
                set_aside(claimed, self.corrupt_folder, _what_is_wrong(raw))
                continue
            if not self.store_processed:
                os.remove(claimed)
            return payload
        raise Empty()

    @contextlib.contextmanager
    def _table_lock(self, exchange: str) -> Iterator[None]:
        """Hold the exchange table's lock file (tables are replaced by rename, so they cannot lock themselves)."""
        self.control_folder.mkdir(parents=True, exist_ok=True)
        with open(self.control_folder / f"{exchange}.exchange.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read_table(self, exchange: str) -> list[filesystem.exchange_queue_t]:
        path = self.control_folder / f"{exchange}.exchange"
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise ChannelError(f"Cannot open {path}") from exc
        try:
            return [filesystem.exchange_queue_t(*q) for q in loads(bytes_to_str(raw))]
        except (ValueError, TypeError):
            set_aside(path, self.corrupt_folder, _what_is_wrong(raw))
            return []

    def get_table(self, exchange: str) -> list[filesystem.exchange_queue_t]:
        """Return the bindings of ``exchange`` (none if its table is missing or corrupt)."""
        return self._read_table(exchange)

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        """Add the binding to the exchange's table, written atomically."""
        binding = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        with self._table_lock(exchange):
            queues = self._read_table(exchange)
            if binding in queues:
                return
            queues.insert(0, binding)
            path = self.control_folder / f"{exchange}.exchange"
            try:
                write_atomically(path, str_to_bytes(dumps(queues)))
            except OSError as exc:
                raise ChannelError(f"Cannot write {path}: {exc.strerror}") from exc


class Transport(filesystem.Transport):
    """kombu's filesystem transport with ``Channel`` above (``filesystem://`` URLs).

    ``worker_wait_s``: in a Celery worker (set by ``botmesh_admin.celery`` when
    it starts), the longest one ``drain_events`` waits. Celery runs a transport
    without asynchronous I/O in its blocking loop (``celery.worker.loops.synloop``),
    which waits in ``drain_events(timeout=2.0)`` and only after it runs its
    pending operations — among them the acks of finished tasks (``call_soon``).
    With acks late and a prefetch of one, the next message could not come
    before that ack: a worker took one task every two seconds, however short
    (the live queue's wake-ups queued behind each other, and a webhook's message
    reached the inbox 3 s after it, a minute on a busy machine). Outside a
    worker (``None``) a caller's timeout is kept: a control command collecting
    replies for a second must not stop after a tenth.
    """

    Channel = Channel
    worker_wait_s: float | None = None

    @property
    def default_connection_params(self) -> dict[str, Any]:
        """Return no host: this broker is a directory (kombu's default, ``localhost``, made it warn at every start)."""
        return {"port": self.default_port}

    def drain_events(self, connection: Any, timeout: float | None = None) -> Any:
        wait = self.worker_wait_s
        if wait is not None and timeout is not None and timeout > wait:
            timeout = wait  # back to Celery's loop, which acks what finished, then here again
        return super().drain_events(connection, timeout=timeout)
