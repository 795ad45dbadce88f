"""The kernel clock: epoch milliseconds, swappable in tests.

Services, stores and the journal read the time through ``now_ms()``; a test
fixes it with ``use_clock(FakeClock(start_ms))`` and moves it with
``advance``/``set`` instead of sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

C = TypeVar("C", bound=Callable[[], int])

_clock: Callable[[], int] | None = None


def wall_ms() -> int:
    """Return the wall-clock time in epoch milliseconds (never the ``use_clock`` override)."""
    return time.time_ns() // 1_000_000


def now_ms() -> int:
    """Return the time in epoch milliseconds: the ``use_clock`` clock's, else the wall clock's."""
    clock = _clock
    if clock is not None:
        return int(clock())
    return time.time_ns() // 1_000_000


def monotonic_ms() -> float:
    """Return milliseconds on a clock that never goes back, for deadlines and leases.

    ``time.monotonic()`` in ms, or, inside ``use_clock``, that clock's epoch ms, so a
    test moves lease deadlines with ``FakeClock.advance`` as it moves ``now_ms()``.
    Only differences between two readings mean anything.
    """
    clock = _clock
    if clock is not None:
        return float(clock())
    return time.monotonic_ns() / 1_000_000


@contextmanager
def use_clock(clock: C) -> Iterator[C]:
    """Make ``now_ms()`` and ``monotonic_ms()`` answer ``clock()`` (epoch ms) in every thread for the block."""
    global _clock
    previous, _clock = _clock, clock
    try:
        yield clock
    finally:
        _clock = previous


class FakeClock:
    """A clock that stands still until told: ``FakeClock(start_ms)()`` is ``start_ms``.

    Thread-safe; ``advance(ms)`` moves it forward, ``set(ms)`` to any time.
    """

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        """Start at ``start_ms`` (epoch ms; by default 2023-11-14, a fixed time for repeatable tests)."""
        self._now = int(start_ms)
        self._lock = threading.Lock()

    def __call__(self) -> int:
        """Return the current fake time in epoch milliseconds."""
        return self._now

    def advance(self, ms: int) -> int:
        """Move the clock ``ms`` milliseconds forward (not backward: use ``set``); return the new time."""
        if ms < 0:
            raise ValueError(f"advance takes a non-negative number of milliseconds, not {ms}")
        with self._lock:
            self._now += int(ms)
            return self._now

    def set(self, ms: int) -> None:
        """Set the clock to ``ms`` (epoch milliseconds)."""
        with self._lock:
            self._now = int(ms)

    def __repr__(self) -> str:
        return f"FakeClock({self._now})"


__all__ = ["FakeClock", "monotonic_ms", "now_ms", "use_clock", "wall_ms"]
