"""``cas_retry``: a compare-and-set miss is tried again after a jittered pause, at most ``attempts`` times."""

from __future__ import annotations

import threading

import pytest

from botmesh_admin.errors import Conflict
from botmesh_admin.kv.base import ANY, ConflictError, Put
from botmesh_admin.kv.cas import BACKOFF_CAP_MS, CAS_ATTEMPTS, cas_backoff, cas_backoff_s, cas_retry
from botmesh_admin.kv.memory import MemoryKv


def _miss() -> ConflictError:
    return ConflictError("t", "k", 1, 2)


def test_a_miss_is_tried_again_and_the_success_returned() -> None:
    calls: list[int] = []

    def attempt() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise _miss()
        return "written"

    assert cas_retry(attempt, what="counter") == "written"
    assert len(calls) == 3


def test_after_attempts_misses_it_is_a_conflict_naming_what() -> None:
    calls: list[int] = []

    def attempt() -> None:
        calls.append(1)
        raise _miss()

    with pytest.raises(Conflict) as caught:
        cas_retry(attempt, what="plugin 'acme.p1'")
    assert len(calls) == CAS_ATTEMPTS == 8
    assert str(caught.value.message) == "plugin 'acme.p1' keeps changing; try again"
    assert not isinstance(caught.value, ConflictError)  # the caller's 409, not the Kv's miss
    assert isinstance(caught.value.__cause__, ConflictError)


def test_attempts_and_exhausted_are_the_callers() -> None:
    calls: list[int] = []

    def attempt() -> None:
        calls.append(1)
        raise _miss()

    with pytest.raises(RuntimeError, match="gave up"):
        cas_retry(attempt, what="x", attempts=3, exhausted=lambda: RuntimeError("gave up"))
    assert len(calls) == 3


def test_a_domain_conflict_or_any_other_error_propagates_at_once() -> None:
    calls: list[int] = []

    def refuse() -> None:
        calls.append(1)
        raise Conflict("conversation is closed")

    with pytest.raises(Conflict, match="conversation is closed"):
        cas_retry(refuse, what="conversation")
    with pytest.raises(KeyError):
        cas_retry(lambda: {}["x"], what="x")
    assert calls == [1]


def test_retry_on_names_a_stores_own_revision_error() -> None:
    class Stale(Exception):
        pass

    calls: list[int] = []

    def attempt() -> int:
        calls.append(1)
        if len(calls) == 1:
            raise Stale()
        return 7

    assert cas_retry(attempt, what="x", retry_on=Stale) == 7
    with pytest.raises(ConflictError):  # not in retry_on: propagates
        cas_retry(lambda: (_ for _ in ()).throw(_miss()), what="x", retry_on=Stale)


def test_backoff_is_full_jitter_doubling_from_one_ms_capped_at_fifty() -> None:
    for n, ceiling in [(0, 0.001), (1, 0.002), (3, 0.008), (5, 0.032), (6, 0.05), (40, 0.05)]:
        pauses = [cas_backoff_s(n) for _ in range(200)]
        assert all(0 <= p <= ceiling for p in pauses)
        assert max(pauses) > ceiling / 2  # spread over the range, not a fixed pause
    assert BACKOFF_CAP_MS == 50
    assert 0 <= cas_backoff(0) <= 0.001


def test_concurrent_increments_through_a_real_kv_lose_nothing() -> None:
    """Eight threads each add 25 by read → +1 → CAS write: the counter ends at 200."""
    kv = MemoryKv("memory://")
    kv.commit("t", [Put("n", 0, expect=ANY)])
    start = threading.Barrier(8)

    def bump() -> None:
        entry = kv.get("t", "n")
        assert entry is not None
        kv.commit("t", [Put("n", entry.value + 1, expect=entry.version)])

    def worker() -> None:
        start.wait()
        for _ in range(25):
            cas_retry(bump, what="counter", attempts=1000)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    entry = kv.get("t", "n")
    assert entry is not None and entry.value == 200


def test_retry_if_lets_a_miss_on_another_key_propagate() -> None:
    calls: list[str] = []

    def attempt() -> None:
        calls.append("x")
        raise ConflictError("t", "own-op" if len(calls) == 2 else "guard", 1, 2)

    with pytest.raises(ConflictError) as caught:
        cas_retry(attempt, what="x", retry_if=lambda miss: miss.key == "guard")
    assert caught.value.key == "own-op" and len(calls) == 2
