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

Celery workers (``botmesh_admin/celery.py`` connects the signals): the main
process makes, before its pool forks (``prepare_worker``, ``worker_init``), a
stop flag and an in-flight send count shared with its pool children. A SIGTERM
to the main process (``on_worker_shutting_down``) or to a pool child
(``on_task_start`` installs the handler when a task starts: the first SIGTERM
only marks it stopping) sets the flag, so ``stopping()`` is True in the process that runs
the task: a campaign sends no new batch, the reply outbox no new reply; the
requests in flight finish and are recorded, and the task hands the rest over
(requeued) for after the restart. Celery's warm shutdown waits for the running
task; if that outlasts the drain timeout the worker is forced out: pool
children killed, unacknowledged tasks redelivered (``acks_late``), and the exit
status is 1 with a log line of how many sends it cut off (0 when none was).
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
# A Celery worker's (stop flag, in-flight sends), shared with its pool children (made before they fork).
_shared: tuple[Any, Any] | None = None
_worker_pid = 0


@contextmanager
def inflight(sends: int = 1) -> Iterator[None]:
    """Count the block as in-flight sends (``sends`` requests): a SIGTERM waits for it (up to the drain timeout)."""
    global _inflight
    shared = _shared
    with _cond:
        _inflight += 1
    if shared is not None:
        with shared[1].get_lock():
            shared[1].value += sends
    try:
        yield
    finally:
        if shared is not None:
            with shared[1].get_lock():
                shared[1].value -= sends
        with _cond:
            _inflight -= 1
            if _inflight == 0:
                _cond.notify_all()


def stopping() -> bool:
    """Return True once this process (or, in a Celery worker, its main process or any pool child) was told to stop.

    Senders check it before each batch or reply: none starts after a stop.
    """
    return health._stopping.is_set() or (_shared is not None and bool(_shared[0].value))


def _mark_stopping() -> None:
    health.mark_stopping()
    if _shared is not None:
        _shared[0].value = 1


def worker_inflight_sends() -> int:
    """Return the sends in flight in this Celery worker and its pool children (0 outside a worker)."""
    return int(_shared[1].value) if _shared is not None else 0


def prepare_worker(**_: Any) -> None:
    """Celery ``worker_init`` (main process, before the pool forks): make the shared stop flag and send count."""
    global _shared, _worker_pid
    import multiprocessing

    if _shared is None:
        _shared = (multiprocessing.RawValue("i", 0), multiprocessing.Value("i", 0))
        _worker_pid = os.getpid()


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


def on_task_start(**_: Any) -> None:
    """Celery ``task_prerun``: in a prefork pool child, a SIGTERM marks it stopping instead of ending it.

    Installed when a task starts, because billiard replaces a child's SIGTERM
    handler after ``worker_process_init``. A SIGTERM to the whole process
    group (systemd's default) reaches the child that runs the task: the task
    starts no new send and finishes the ones in flight. A second SIGTERM gets
    billiard's handler (the child exits). Not in the worker's main process
    (a solo pool): Celery's own handler runs the warm shutdown there.
    """
    if _shared is None or os.getpid() == _worker_pid or threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGTERM)
    if getattr(current, "botmesh_child_stop", False):
        return

    seen: list[int] = []

    def on_sigterm(signum: int, frame: Any) -> None:
        if not seen:  # this child's first SIGTERM (the main process may have set the shared flag already)
            seen.append(signum)
            _mark_stopping()
            log.info("pool child %d: stopping (no new send starts; %d in flight)", os.getpid(), inflight_count())
            return
        if callable(current):
            current(signum, frame)
        else:
            os._exit(1 if inflight_count() else 0)

    on_sigterm.botmesh_child_stop = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGTERM, on_sigterm)


def on_worker_shutting_down(
    sig: str | None = None, how: str | None = None, exitcode: int | None = None, **_: Any
) -> None:
    """Celery ``worker_shutting_down``: mark the worker and its pool children stopping; force the exit if the
    warm shutdown outlasts the drain timeout (exit status 1 when that cut sends off)."""
    _mark_stopping()
    limit = _timeout(None)
    log.info("worker stopping: no new send starts; %d send(s) in flight, at most %g s", worker_inflight_sends(), limit)

    def watchdog() -> None:
        # A worker that finishes its warm shutdown in time exits first and takes this thread with it.
        time.sleep(limit)
        cut = worker_inflight_sends()
        _kill_pool_children()
        _flush_all()
        if cut:
            log.error(
                "forced exit %.0f s after shutdown began: %d send(s) cut off in flight (their slots end "
                "in_doubt, never resent automatically); unacked tasks are redelivered",
                limit,
                cut,
            )
        else:
            log.warning(
                "worker still running %.0f s after shutdown began; exiting (no send in flight; unacked "
                "tasks are redelivered)",
                limit,
            )
        os._exit(1 if cut else (exitcode or 0))

    threading.Thread(target=watchdog, name="botmesh-worker-drain", daemon=True).start()


def _kill_pool_children() -> None:
    """SIGKILL this process's pool children (a forced exit must not leave them sending on)."""
    try:
        from billiard.process import active_children
    except ImportError:  # not a Celery worker
        return
    for child in active_children():
        if child.pid:
            try:
                os.kill(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
