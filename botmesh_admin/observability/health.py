"""Liveness (``/healthz``) and readiness (``/readyz``) probes (ARCHITECTURE §10).

Readiness checks every dependency this process needs — the database, the Kv,
the event journal and, where configured, Redis — and answers 503 naming each
one that is not reachable, or naming that the process is stopping.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse

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


def _check_redis() -> None:
    import redis

    client = redis.Redis.from_url(settings.BOTMESH_REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        client.ping()
    finally:
        client.close()


def readiness() -> dict[str, str]:
    """Return ``{check: "ok" | error text}`` for every dependency."""
    checks: dict[str, Callable[[], None]] = {"database": _check_database, "kv": _check_kv}
    if settings.BOTMESH_REDIS_URL:
        checks["redis"] = _check_redis
    checks.update(_extra_checks)
    results: dict[str, str] = {}
    for name, check in checks.items():
        try:
            check()
            results[name] = "ok"
        except Exception as exc:  # a probe reports, never raises
            results[name] = f"{type(exc).__name__}: {exc}"[:300]
    return results


def healthz(request: HttpRequest) -> JsonResponse:
    """Answer 200 while the process is alive."""
    return JsonResponse({"status": "alive"})


def readyz(request: HttpRequest) -> JsonResponse:
    """Answer 200 when every dependency is reachable, else 503 naming what is not."""
    if _stopping.is_set():
        return JsonResponse({"status": "stopping", "reason": "process is shutting down"}, status=503)
    results = readiness()
    failing = {k: v for k, v in results.items() if v != "ok"}
    if failing:
        reason = "; ".join(f"{k} unreachable ({v})" for k, v in failing.items())
        return JsonResponse({"status": "unready", "reason": reason, "checks": results}, status=503)
    return JsonResponse({"status": "ready", "checks": results})
