"""Coalesced ``events.drain`` wake-ups: a few broker messages per channel per interval, not one per event.

``event_publish`` queued one ``events.drain`` task per appended record. A drain
handles every ready record of its channel (up to its limit), so under load most
of those tasks found nothing left to do, and queueing them was the largest cost
of a webhook request (Celery's publish path: about 1 ms of CPU each).

``DrainWakeups.request(channel)``, called once the append has committed, queues
a drain at once when none was queued for that channel in the last
``interval_s``; otherwise it leaves one *trailing* drain, queued by a timer when
the interval ends. Every record therefore gets a drain queued after its commit,
at most ``interval_s`` later, and a burst costs one message per interval. A
trailing drain lost with its process (a restart within the interval) only
delays the records until beat's safety-net drain: the journal holds them.

The trailing drains of a process are queued by one long-lived thread per
channel (``TimerLanes`` of ``TimerThread``), not a ``threading.Timer`` each:
Celery set up its producer anew in every thread that had never queued a task,
so a drain queued from a fresh thread cost about 6.5 ms of CPU (8 ms on a
Redis broker) against 0.5 ms (1.3 ms) from a thread that stays — at twenty
trailing drains a second per web process, about 1 ms of CPU per webhook
(issue 21). One thread per channel, so a publish that blocks (a broker that
does not answer) delays only its own channel's drains.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

DEFAULT_INTERVAL_S = 0.05  # seconds: the most a record waits for its drain to be queued

log = logging.getLogger(__name__)


class TimerThread:
    """Run delayed calls in due order on one daemon thread per process, started on first use.

    Call it like ``threading.Timer``: ``timer(delay_s, fn, args)`` returns a timer
    whose ``start()`` schedules ``fn(*args)`` ``delay_s`` seconds from now (monotonic);
    ``daemon`` is accepted and ignored (the thread is a daemon). A call that raises is
    logged and the thread goes on. A forked child starts with no thread and nothing
    scheduled (its parent's calls are the parent's).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._reset()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def __call__(self, delay_s: float, fn: Callable[..., Any], args: tuple[Any, ...] = ()) -> _Scheduled:
        return _Scheduled(self, delay_s, fn, tuple(args))

    def schedule(self, delay_s: float, fn: Callable[..., Any], args: tuple[Any, ...] = ()) -> None:
        """Run ``fn(*args)`` on the timer thread ``delay_s`` seconds from now."""
        with self._cond:
            heapq.heappush(self._due, (self._clock() + max(0.0, delay_s), next(self._order), fn, args))
            if self._thread is None or not self._thread.is_alive():  # first use, or a call ended it (BaseException)
                self._thread = threading.Thread(target=self._run, name="botmesh-drain-timer", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while True:
                    now = self._clock()
                    if self._due and self._due[0][0] <= now:
                        _, _, fn, args = heapq.heappop(self._due)
                        break
                    cond.wait(self._due[0][0] - now if self._due else None)
            try:
                fn(*args)
            except Exception:  # a timer that raises never stops the others
                log.exception("a delayed call on the drain timer thread failed")


class _Scheduled:
    """One call of a ``TimerThread``, scheduled on ``start()`` (the ``threading.Timer`` interface)."""

    def __init__(self, owner: TimerThread, delay_s: float, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.owner, self.delay_s, self.fn, self.args = owner, delay_s, fn, args
        self.daemon = True

    def start(self) -> None:
        self.owner.schedule(self.delay_s, self.fn, self.args)


class TimerLanes:
    """``TimerThread``s by lane: ``lanes(delay_s, fn, args)`` runs on the thread of ``args[0]`` (a channel).

    The ``threading.Timer`` interface, like ``TimerThread``; each lane's thread
    starts on its first call. A forked child starts with no lane.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lanes: dict[object, TimerThread] = {}
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._lanes = {}

    def __call__(self, delay_s: float, fn: Callable[..., Any], args: tuple[Any, ...] = ()) -> _Scheduled:
        lane = args[0] if args else None
        with self._lock:
            timer = self._lanes.get(lane)
            if timer is None:
                timer = self._lanes[lane] = TimerThread()
        return timer(delay_s, fn, args)


TIMERS = TimerLanes()
"""The process's timer threads, one per channel: the default ``timer`` of ``DrainWakeups``."""


class DrainWakeups:
    """Call ``send(channel)`` at most once per ``interval_s`` per channel, always after the last request.

    ``send_later`` (default ``send``) queues the trailing drains, from the timer's
    thread. ``clock`` returns seconds (monotonic); ``timer(delay_s, fn, args)``
    returns a timer that runs on ``start()`` (``TIMERS``, the process's timer
    thread of the channel; ``threading.Timer`` works too; tests pass a fake).
    """

    def __init__(
        self,
        send: Callable[[str | None], None],
        *,
        send_later: Callable[[str | None], None] | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        timer: Callable[..., Any] = TIMERS,
    ) -> None:
        self._send = send
        self._send_later = send_later or send
        self.interval_s = interval_s
        self._clock = clock
        self._timer = timer
        self._lock = threading.Lock()
        self._last: dict[str | None, float] = {}
        self._trailing: set[str | None] = set()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        # A parent's timer threads do not exist in the child: start from nothing.
        self._lock = threading.Lock()
        self._last = {}
        self._trailing = set()

    def request(self, channel: str | None) -> None:
        """Make sure a drain of ``channel`` is queued after this call: now, or when the interval ends."""
        now = self._clock()
        with self._lock:
            last = self._last.get(channel)
            send_now = last is None or now - last >= self.interval_s
            if send_now:
                self._last[channel] = now
            elif channel not in self._trailing and last is not None:
                # A request seen while a trailing drain is pending is covered by it: the
                # timer takes the lock (after this request) before it sends.
                self._trailing.add(channel)
                timer = self._timer(last + self.interval_s - now, self._fire, args=(channel,))
                timer.daemon = True
                timer.start()
        if send_now:
            self._send(channel)

    def _fire(self, channel: str | None) -> None:
        with self._lock:
            self._trailing.discard(channel)
            self._last[channel] = self._clock()
        self._send_later(channel)
