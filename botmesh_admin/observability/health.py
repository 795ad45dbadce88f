"""Liveness (``/healthz``) and readiness (``/readyz``) probes (ARCHITECTURE §10).

Readiness checks every dependency this process needs — the database, the Kv,
the event journal and, where configured, Redis — and answers 503 naming each
one that is not reachable, or naming that the process is stopping. It also
writes: a small file in the data dir is written, fsynced and deleted, so a
full disk (the SQLite database, the Kv, the journal and the embedded broker
live there by default) reads "disk full" instead of ready — reads alone go on
working on a full disk.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import uuid
from collections.abc import Callable

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_http_methods

_stopping = threading.Event()
_extra_checks: dict[str, Callable[[], None]] = {}


def mark_stopping() -> None:
    """Make ``/readyz`` answer 503 from now on (called on SIGTERM before draining)."""
    _stopping.set()


def register_check(name: str, check: Callable[[], None]) -> None:
    """Add a readiness check; ``check`` raises on failure. Used by the journal and coordinator."""
    _extra_checks[name] = check


def _check_database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def _check_kv() -> None:
    from botmesh_admin.kv.runtime import default_kv

    default_kv().ping()


class DiskFull(OSError):
    """The data dir has no space left for a write (``ENOSPC`` or ``EDQUOT``)."""


DISK_PROBE_BYTES = 512


def _check_disk() -> None:
    """Write ``DISK_PROBE_BYTES`` to a new file in the data dir, fsync it and delete it.

    Raise ``DiskFull`` when there is no space (or quota) left, ``OSError`` for
    any other failure (a read-only or vanished directory).
    """
    directory = settings.BOTMESH_DATA_DIR
    path = os.path.join(directory, f".readyz-{uuid.uuid4().hex}")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, b"\0" * DISK_PROBE_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFull(exc.errno, f"disk full: no space left to write in {directory}") from exc
        raise
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _check_redis() -> None:
    import redis

    client = redis.Redis.from_url(settings.BOTMESH_REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        client.ping()
    finally:
        client.close()


def readiness() -> dict[str, str]:
    """Return ``{check: "ok" | error text}`` for every dependency."""
    checks: dict[str, Callable[[], None]] = {"database": _check_database, "kv": _check_kv, "disk": _check_disk}
    if settings.BOTMESH_REDIS_URL:
        checks["redis"] = _check_redis
    checks.update(_extra_checks)
    results: dict[str, str] = {}
    for name, check in checks.items():
        try:
            check()
            results[name] = "ok"
        except DiskFull as exc:
            results[name] = exc.strerror or "disk full"
        except Exception as exc:  # a probe reports, never raises
            results[name] = f"{type(exc).__name__}: {exc}"[:300]
    return results


def _reason(name: str, result: str) -> str:
    if name == "disk":
        return result if result.startswith("disk full") else f"data dir not writable ({result})"
    return f"{name} unreachable ({result})"


# A probe only reads: another method is 405 with ``Allow: GET, HEAD`` (RFC 9110 §15.5.6), not a GET's answer.
probe_methods = require_http_methods(["GET", "HEAD"])


@probe_methods
def healthz(request: HttpRequest) -> JsonResponse:
    """Answer 200 while the process is alive (GET and HEAD; any other method 405)."""
    return JsonResponse({"status": "alive"})


@probe_methods
def readyz(request: HttpRequest) -> JsonResponse:
    """Answer 200 when every dependency is reachable, else 503 naming what is not (GET and HEAD; else 405)."""
    if _stopping.is_set():
        return JsonResponse({"status": "stopping", "reason": "process is shutting down"}, status=503)
    results = readiness()
    failing = {k: v for k, v in results.items() if v != "ok"}
    if failing:
        reason = "; ".join(_reason(k, v) for k, v in failing.items())
        return JsonResponse({"status": "unready", "reason": reason, "checks": results}, status=503)
    return JsonResponse({"status": "ready", "checks": results})
