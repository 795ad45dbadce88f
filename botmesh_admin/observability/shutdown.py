"""Graceful shutdown: drain in-flight sends, then exit (ARCHITECTURE §10).

The send path wraps each send::

    from botmesh_admin.observability.shutdown import inflight
    with inflight():
        result = provider.send(...)
        record(result)

On SIGTERM (``install()``, done for web servers by ``ObservabilityConfig.ready()``):
``/readyz`` answers 503 at once (``health.mark_stopping``), the process keeps
serving what it already accepted, waits until no send is in flight or
``settings.BOTMESH_DRAIN_TIMEOUT_S`` seconds have passed, flushes metrics and
traces, and then lets the previous SIGTERM handler run (gunicorn's graceful
exit) or exits: status 0 when every send finished, 1 when the timeout cut some off.

Celery workers: ``on_worker_shutting_down`` (the ``worker_shutting_down``
signal) marks the worker stopping; Celery's warm shutdown lets running tasks
(and the sends inside them) finish, and if that takes longer than the drain
timeout the worker is made to exit — its unacknowledged tasks are redelivered
(``acks_late``), never lost.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from . import health

log = logging.getLogger(__name__)

_cond = threading.Condition()
_inflight = 0
_installed = False
_drained = threading.Event()
_abandoned = False  # the drain timed out with sends still in flight
_draining = False
_previous: Any = signal.SIG_DFL


@contextmanager
def inflight() -> Iterator[None]:
    """Count the block as an in-flight send: a SIGTERM waits for it (up to the drain timeout)."""
    global _inflight
    with _cond:
        _inflight += 1
    try:
        yield
    finally:
        with _cond:
            _inflight -= 1
            if _inflight == 0:
                _cond.notify_all()


def inflight_count() -> int:
    """Return how many sends are in flight in this process."""
    with _cond:
        return _inflight


def drain(timeout_s: float) -> bool:
    """Wait until no send is in flight, at most ``timeout_s`` seconds; return True if none is left."""
    deadline = time.monotonic() + timeout_s
    with _cond:
        while _inflight > 0:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            _cond.wait(left)
    return True


def _timeout(timeout_s: float | None) -> float:
    if timeout_s is not None:
        return timeout_s
    from django.conf import settings

    return float(settings.BOTMESH_DRAIN_TIMEOUT_S)


def _flush_all() -> None:
    from . import metrics, tracing

    for flush in (metrics.flush, tracing.force_flush):
        try:
            flush()
        except Exception as exc:  # exiting matters more than a last flush
            log.warning("flush on shutdown failed: %s", type(exc).__name__)


def stop_gracefully(timeout_s: float | None = None, then: Callable[[], None] | None = None) -> bool:
    """Mark the process stopping, drain in-flight sends, flush metrics and traces; return True if drained."""
    health.mark_stopping()
    limit = _timeout(timeout_s)
    log.info("stopping: draining %d in-flight send(s), at most %g s", inflight_count(), limit)
    drained = drain(limit)
    if not drained:
        log.warning("drain timeout: %d send(s) still in flight after %g s", inflight_count(), limit)
    _flush_all()
    if then is not None:
        then()
    return drained


def install(timeout_s: float | None = None) -> None:
    """Handle SIGTERM in this process (main thread only): stop gracefully, then exit. Idempotent.

    Python runs signal handlers in the main thread when it next executes
    bytecode; servers' main loops poll (runserver every 0.5 s, gunicorn's
    workers every second), so the handler runs within that delay.
    """
    global _installed, _previous
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    _previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda signum, frame: _on_sigterm(signum, frame, timeout_s))
    _installed = True


def _on_sigterm(signum: int, frame: Any, timeout_s: float | None) -> None:
    global _draining
    if _drained.is_set():
        # Back in the main thread after draining: hand over to whoever handled SIGTERM before us.
        if callable(_previous):
            _previous(signum, frame)
        elif _previous != signal.SIG_IGN:
            if _abandoned:
                os._exit(1)  # a send thread still runs and would keep the interpreter alive
            raise SystemExit(0)
        return
    if _draining:
        return  # a second SIGTERM while draining changes nothing
    _draining = True
    health.mark_stopping()
    main_id = threading.main_thread().ident

    def drain_then_exit() -> None:
        global _abandoned
        _abandoned = not stop_gracefully(timeout_s)
        _drained.set()
        if main_id is not None:
            signal.pthread_kill(main_id, signal.SIGTERM)  # wakes a main thread blocked in a system call

    threading.Thread(target=drain_then_exit, name="botmesh-drain", daemon=True).start()


def on_worker_shutting_down(sig: str | None = None, how: str | None = None, exitcode: int | None = None,
                            **_: Any) -> None:
    """Celery ``worker_shutting_down``: mark stopping; force the exit if the warm shutdown outlasts the drain timeout."""
    health.mark_stopping()
    limit = _timeout(None)

    def watchdog() -> None:
        # A worker that finishes its warm shutdown in time exits first and takes this thread with it.
        time.sleep(limit)
        _flush_all()
        log.warning("worker still running %.0f s after shutdown began; exiting (unacked tasks are redelivered)", limit)
        os._exit(exitcode or 0)

    threading.Thread(target=watchdog, name="botmesh-worker-drain", daemon=True).start()
