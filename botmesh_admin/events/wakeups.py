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
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

DEFAULT_INTERVAL_S = 0.05  # seconds: the most a record waits for its drain to be queued


class DrainWakeups:
    """Call ``send(channel)`` at most once per ``interval_s`` per channel, always after the last request.

    ``send_later`` (default ``send``) queues the trailing drains, from the timer's
    thread. ``clock`` returns seconds (monotonic); ``timer(delay_s, fn, args)``
    returns a timer that runs on ``start()`` (``threading.Timer``; tests pass a fake).
    """

    def __init__(
        self,
        send: Callable[[str | None], None],
        *,
        send_later: Callable[[str | None], None] | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        timer: Callable[..., Any] = threading.Timer,
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
