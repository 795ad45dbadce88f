"""Compare-and-set retries: read → change → compare-and-set write, bounded, with jittered backoff.

Every writer that reads a record, changes it and writes it back with an
expectation (``Put(..., expect=version)``) loses the race now and then to
another writer; the Kv then refuses the batch with ``ConflictError`` and
nothing of it is applied. ``cas_retry`` runs such an attempt again after a
short random pause (full jitter, AWS Architecture Blog "Exponential Backoff
And Jitter", 2015), at most ``CAS_ATTEMPTS`` times, then gives up with a
``Conflict`` (HTTP 409) the caller can show: "… keeps changing; try again".
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from botmesh_admin.errors import Conflict

from .base import ConflictError

T = TypeVar("T")

CAS_ATTEMPTS = 8
"""How many times ``cas_retry`` runs an attempt before it gives up (the one retry limit)."""

CONTENDED_ATTEMPTS = 20
"""The bound of a record many writers change at once (a plugin, a bot's versions and gates, CRM rows re-read,
a CRM tenant's segment definitions, an inbox read marker the backfill gives its chat's state).

Above the default 8 because those records take bursts — installs, upgrades and
admins on one plugin, every CI runner publishing and reporting gates on one
bot, an import's rows merging into contacts a segment sync rewrites — and with
8 a burst answers 409 (or gives up) sooner; 20 was each package's bound before
issue 14.
"""

BACKOFF_BASE_MS = 1
BACKOFF_CAP_MS = 50


def cas_backoff_s(n: int) -> float:
    """Return the pause before retry ``n`` (0 for the first), in seconds, without sleeping.

    Uniform in ``[0, min(50 ms, 1 ms·2ⁿ)]`` ("full jitter"): writers that collided
    once spread out instead of colliding again in step.
    """
    ceiling_ms = min(BACKOFF_CAP_MS, BACKOFF_BASE_MS * 2 ** min(max(n, 0), 16))
    return random.uniform(0, ceiling_ms) / 1000


def cas_backoff(n: int) -> float:
    """Sleep the pause before retry ``n`` (``cas_backoff_s(n)``) and return it in seconds."""
    pause = cas_backoff_s(n)
    if pause > 0:
        time.sleep(pause)
    return pause


def cas_retry(
    attempt: Callable[[], T],
    *,
    what: str,
    attempts: int = CAS_ATTEMPTS,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] = ConflictError,
    retry_if: Callable[[Any], bool] | None = None,
    exhausted: Callable[[], BaseException] | None = None,
) -> T:
    """Return what ``attempt()`` returns, running it again after each compare-and-set miss.

    ``attempt`` reads, changes and writes with expectations; it must have no
    effect when it raises ``retry_on`` (default ``ConflictError``, the Kv's CAS
    miss — a domain conflict such as a state refusal is another class and
    propagates at once, as does every other exception). A store whose own
    revision-mismatch error is another class passes it as ``retry_on``;
    ``retry_if(miss)`` narrows it (False: the miss propagates, e.g. a
    ``ConflictError`` on a key other than the guard the attempt re-reads).

    After ``attempts`` misses raise ``Conflict("<what> keeps changing; try
    again")`` (HTTP 409), chained to the last miss; ``exhausted`` builds
    another error instead (a caller whose contract names one).
    """
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, not {attempts}")
    for n in range(attempts):
        try:
            return attempt()
        except retry_on as miss:
            if retry_if is not None and not retry_if(miss):
                raise
            if n + 1 == attempts:
                error = exhausted() if exhausted is not None else Conflict(f"{what} keeps changing; try again")
                raise error from miss
            cas_backoff(n)
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


__all__ = ["BACKOFF_CAP_MS", "CAS_ATTEMPTS", "CONTENDED_ATTEMPTS", "cas_backoff", "cas_backoff_s", "cas_retry"]
