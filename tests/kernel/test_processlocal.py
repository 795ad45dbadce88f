"""``ProcessLocal``: one value per process, built once under concurrency, rebuilt in a forked child."""

from __future__ import annotations

import os
import threading
import time

from botmesh_admin.processlocal import ProcessLocal


def test_built_lazily_once_and_shared() -> None:
    built: list[object] = []

    def factory() -> object:
        built.append(object())
        return built[-1]

    local = ProcessLocal(factory)
    assert built == []
    first = local.get()
    assert local.get() is first
    assert built == [first]


def test_concurrent_first_gets_build_once() -> None:
    """Sixteen threads released at once by a barrier all get the same value; the factory ran once."""
    calls: list[int] = []

    def slow_factory() -> object:
        calls.append(1)
        time.sleep(0.05)  # wide window for a second builder to slip in
        return object()

    local = ProcessLocal(slow_factory)
    start = threading.Barrier(16)
    seen: list[object] = []
    lock = threading.Lock()

    def worker() -> None:
        start.wait()
        value = local.get()
        with lock:
            seen.append(value)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert len(seen) == 16
    assert len({id(v) for v in seen}) == 1
    assert len(calls) == 1


def test_use_overrides_for_a_block_in_every_thread_and_nests() -> None:
    local = ProcessLocal(lambda: "built")
    with local.use("outer"):
        other: list[str] = []
        t = threading.Thread(target=lambda: other.append(local.get()))
        t.start()
        t.join(timeout=5)
        assert other == ["outer"]
        with local.use("inner"):
            assert local.get() == "inner"
        assert local.get() == "outer"
    assert local.get() == "built"


def test_reset_closes_the_value_and_the_next_get_builds_anew() -> None:
    closed: list[object] = []
    local = ProcessLocal(object, close=closed.append)
    first = local.get()
    local.reset()
    assert closed == [first]
    second = local.get()
    assert second is not first
    local.reset()
    local.reset()  # nothing built: nothing to close
    assert closed == [first, second]


def test_a_forked_child_builds_its_own_and_never_closes_the_parents() -> None:
    """After a real fork the child gets a new value (its own pid) and the parent keeps its value, unclosed."""
    closed: list[int] = []
    local: ProcessLocal[dict[str, int]] = ProcessLocal(
        lambda: {"pid": os.getpid()}, close=lambda v: closed.append(v["pid"])
    )
    parent_value = local.get()
    # A thread of the parent holds the lock at the fork: the child must not deadlock on it.
    held = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with local._lock:
            held.set()
            release.wait(5)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(5)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running pytest's teardown
        try:
            os.close(read)
            value = local.get()
            local.reset()  # closes the child's own value only
            ok = value["pid"] == os.getpid() and value is not parent_value and closed == [os.getpid()]
            os.write(write, b"ok" if ok else repr((value, closed)).encode())
        finally:
            os._exit(0)
    release.set()
    holder.join(timeout=5)
    os.close(write)
    try:
        deadline = time.monotonic() + 10
        answer = b""
        while time.monotonic() < deadline:
            chunk = os.read(read, 200)
            if not chunk:
                break
            answer += chunk
    finally:
        os.close(read)
        _, status = os.waitpid(pid, 0)
    assert answer == b"ok"
    assert os.waitstatus_to_exitcode(status) == 0
    assert local.get() is parent_value
    assert closed == []
