"""The kernel clock: ``now_ms`` is epoch ms, ``use_clock(FakeClock(...))`` fixes it for every thread."""

from __future__ import annotations

import threading
import time

import pytest

from botmesh_admin import clock
from botmesh_admin.clock import FakeClock, now_ms, use_clock


def test_now_ms_is_the_wall_clock_in_epoch_milliseconds() -> None:
    before = time.time_ns() // 1_000_000
    assert before <= now_ms() <= time.time_ns() // 1_000_000


def test_use_clock_fixes_now_ms_in_every_thread_and_restores_it() -> None:
    fake = FakeClock(1_000)
    with use_clock(fake) as c:
        assert c is fake
        assert now_ms() == 1_000
        seen: list[int] = []
        t = threading.Thread(target=lambda: seen.append(now_ms()))
        t.start()
        t.join(timeout=5)
        assert seen == [1_000]
        assert fake.advance(250) == 1_250
        assert now_ms() == 1_250
        fake.set(99)
        assert now_ms() == 99
        with use_clock(FakeClock(5)):
            assert now_ms() == 5
        assert now_ms() == 99
    assert now_ms() > 1_600_000_000_000


def test_fake_clock_never_advances_backwards() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        FakeClock(10).advance(-1)


def test_the_old_now_ms_names_are_the_kernel_clock() -> None:
    from botmesh_admin.kv import validation

    with use_clock(FakeClock(42)):
        assert validation.now_ms() == 42
    assert clock.wall_ms() > 1_600_000_000_000


def test_monotonic_ms_follows_time_monotonic_and_the_fake_clock() -> None:
    """Lease deadlines (coordination) read ``monotonic_ms``: real monotonic ms, or the ``use_clock`` clock's."""
    from botmesh_admin.clock import monotonic_ms

    before = time.monotonic() * 1000
    assert before <= monotonic_ms() <= time.monotonic() * 1000
    fake = FakeClock(7_000)
    with use_clock(fake):
        assert monotonic_ms() == 7_000.0
        fake.advance(1_500)
        assert monotonic_ms() == 8_500.0
    assert monotonic_ms() < 1_600_000_000_000  # back on time.monotonic, not the epoch
