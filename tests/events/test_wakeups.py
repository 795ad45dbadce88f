"""Coalesced drain wake-ups: every request is followed by a drain, a burst costs one per interval."""

from __future__ import annotations

from typing import Any

import pytest

from botmesh_admin.events.wakeups import DrainWakeups


class FakeTimers:
    """``threading.Timer`` stand-in: timers run when the test says, in order of due time."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.pending: list[tuple[float, Any, tuple]] = []

    def __call__(self, delay: float, fn: Any, args: tuple = ()) -> FakeTimers._Timer:
        return FakeTimers._Timer(self, self.clock[0] + delay, fn, args)

    class _Timer:
        def __init__(self, owner: FakeTimers, due: float, fn: Any, args: tuple) -> None:
            self.owner, self.due, self.fn, self.args, self.daemon = owner, due, fn, args, False

        def start(self) -> None:
            self.owner.pending.append((self.due, self.fn, self.args))

    def advance(self, seconds: float) -> None:
        self.clock[0] += seconds
        for due, fn, args in sorted(self.pending, key=lambda t: t[0]):
            if due <= self.clock[0]:
                self.pending.remove((due, fn, args))
                fn(*args)


def wakeups() -> tuple[DrainWakeups, list[tuple[float, str | None, str]], FakeTimers]:
    clock = [100.0]
    sent: list[tuple[float, str | None, str]] = []
    timers = FakeTimers(clock)
    w = DrainWakeups(
        lambda ch: sent.append((clock[0], ch, "now")),
        send_later=lambda ch: sent.append((clock[0], ch, "later")),
        interval_s=0.05,
        clock=lambda: clock[0],
        timer=timers,
    )
    return w, sent, timers


def test_a_lone_request_queues_its_drain_at_once() -> None:
    w, sent, timers = wakeups()
    w.request("inbound")
    assert sent == [(100.0, "inbound", "now")] and timers.pending == []


def test_a_burst_costs_one_drain_now_and_one_trailing_drain_after_the_last_request() -> None:
    w, sent, timers = wakeups()
    for _ in range(10):
        w.request("inbound")
        timers.advance(0.004)
    assert sent == [(100.0, "inbound", "now")]
    timers.advance(0.02)  # the interval ends: the trailing drain covers the other nine
    assert [(kind, ch) for _, ch, kind in sent] == [("now", "inbound"), ("later", "inbound")]
    assert sent[1][0] >= 100.04  # queued after the last request


def test_requests_after_a_trailing_drain_get_another_one() -> None:
    w, sent, timers = wakeups()
    w.request("inbound")
    w.request("inbound")
    timers.advance(0.05)
    w.request("inbound")  # right after the trailing drain: within its interval
    assert len(sent) == 2
    timers.advance(0.05)
    assert [kind for _, _, kind in sent] == ["now", "later", "later"]


def test_channels_are_coalesced_separately() -> None:
    w, sent, timers = wakeups()
    w.request("inbound")
    w.request(None)
    w.request("outbox")
    assert [(ch, kind) for _, ch, kind in sent] == [("inbound", "now"), (None, "now"), ("outbox", "now")]


def test_a_quiet_channel_queues_at_once_again() -> None:
    w, sent, timers = wakeups()
    w.request("inbound")
    timers.advance(1.0)
    w.request("inbound")
    assert [kind for _, _, kind in sent] == ["now", "now"]


def test_the_timer_thread_runs_calls_in_due_order_after_their_delay() -> None:
    """``TimerThread`` (``threading.Timer``'s interface) runs each call once, no sooner than asked, earliest first."""
    import threading
    import time

    from botmesh_admin.events.wakeups import TimerThread

    timers = TimerThread()
    ran: list[tuple[str, float, int]] = []
    done = threading.Event()
    start = time.monotonic()

    def note(name: str) -> None:
        ran.append((name, time.monotonic() - start, threading.get_ident()))
        if len(ran) == 3:
            done.set()

    timers(0.06, note, ("late",)).start()
    timers(0.02, note, ("early",)).start()
    timers(0.0, lambda: 1 / 0).start()  # a call that raises is logged; the others still run
    timers(0.04, note, ("middle",)).start()
    assert done.wait(5)
    assert [name for name, _, _ in ran] == ["early", "middle", "late"]
    assert all(at >= delay for (_, at, _), delay in zip(ran, (0.02, 0.04, 0.06), strict=True))
    assert len({thread for _, _, thread in ran}) == 1 and ran[0][2] != threading.get_ident()


def test_trailing_drains_are_queued_from_one_thread_not_a_new_thread_each() -> None:
    """Regression (issue 21): a ``threading.Timer`` per trailing drain set up Celery's producer in every new thread.

    That cost about 6.5 ms of CPU per trailing drain against 0.5 ms from a thread that stays.
    """
    import threading
    import time

    threads: list[threading.Thread] = []  # the objects, not their idents: an ended thread's ident is reused
    done = threading.Event()

    def later(channel: str | None) -> None:
        threads.append(threading.current_thread())
        if len(threads) == 4:
            done.set()

    w = DrainWakeups(lambda ch: None, send_later=later, interval_s=0.01)
    for _ in range(4):  # four bursts, each two requests within one interval: four trailing drains
        w.request("inbound")
        w.request("inbound")
        time.sleep(0.03)
    assert done.wait(5)
    assert all(thread is threads[0] for thread in threads)


def test_a_blocked_trailing_drain_delays_only_its_own_channel() -> None:
    """One timer thread per channel: a publish that hangs (a broker that does not answer) on one channel
    leaves the other channels' trailing drains on time, each from a thread that stays."""
    import threading
    import time

    release = threading.Event()
    sent: dict[str, list[threading.Thread]] = {"outbox": [], "inbound": []}
    inbound_done = threading.Event()

    def later(channel: str | None) -> None:
        assert channel is not None
        sent[channel].append(threading.current_thread())
        if channel == "outbox":
            release.wait(5)  # the broker hangs
        elif len(sent["inbound"]) == 2:
            inbound_done.set()

    w = DrainWakeups(lambda ch: None, send_later=later, interval_s=0.01)
    try:
        for channel in ("outbox", "inbound"):
            w.request(channel)
            w.request(channel)  # a trailing drain for each channel
        time.sleep(0.03)
        w.request("inbound")
        w.request("inbound")  # and a second one for inbound while outbox's still hangs
        assert inbound_done.wait(2), "inbound's trailing drains waited behind outbox's"
        assert sent["inbound"][0] is sent["inbound"][1] is not sent["outbox"][0]
    finally:
        release.set()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the SystemExit, on purpose
def test_a_timer_thread_ended_by_a_call_is_started_again() -> None:
    import threading

    from botmesh_admin.events.wakeups import TimerThread

    timers = TimerThread()
    done = threading.Event()

    def leave() -> None:
        raise SystemExit  # a BaseException: the thread ends

    timers(0.0, leave).start()
    for _ in range(100):
        thread = timers._thread
        if thread is not None and not thread.is_alive():
            break
        threading.Event().wait(0.01)
    timers(0.0, done.set).start()
    assert done.wait(2), "nothing ran after the thread ended"
