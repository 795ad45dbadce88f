"""SIGTERM drains in-flight sends, marks /readyz stopping, then exits — in a real process.

The (fake) provider call of a send answers when the test says so (a line on the
server's stdin, a mark in the worker's Kv), never after a sleep: the SIGTERM
provably lands while the send is in flight.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.test import RequestFactory

from botmesh_admin.kv import Put, connect
from botmesh_admin.observability import health, metrics, shutdown
from botmesh_admin.observability.stores.kv import KvCounterStore
from tests.polling import wait_until

ROOT = Path(__file__).resolve().parents[2]

SERVER = """
import sys, threading, time
import django
django.setup()
from django.test import RequestFactory
from botmesh_admin.observability import health, metrics, shutdown

timeout_s = float(sys.argv[1])
shutdown.install(timeout_s=timeout_s)
answered = threading.Event()       # the (fake) provider answers when the test writes "answer"

def provider():
    if sys.stdin.readline().strip() == "answer":  # not at EOF: communicate() closes stdin
        answered.set()

def send():
    with shutdown.inflight():
        print("send-started", flush=True)
        answered.wait()             # a slow (fake) provider call
        metrics.count("messages.out")  # the send is recorded once it completed
        print("send-done", flush=True)

def watch_readiness():
    health._stopping.wait()
    print("readyz", health.readyz(RequestFactory().get("/readyz")).status_code, flush=True)

threading.Thread(target=provider, daemon=True).start()
threading.Thread(target=send).start()
threading.Thread(target=watch_readiness, daemon=True).start()
idle = threading.Event()
while True:                        # the main thread polls, like a server loop (runserver: every 0.5 s)
    idle.wait(0.5)
"""


def run_server(tmp_path: Path, timeout_s: float) -> tuple[subprocess.Popen[str], str]:
    url = f"sqlite:///{tmp_path}/kv.sqlite3"
    env = {
        **os.environ,
        "BOTMESH_KV_URL": url,
        "DJANGO_SETTINGS_MODULE": "botmesh_admin.settings",
        "BOTMESH_DATA_DIR": str(tmp_path),
        "OTEL_SDK_DISABLED": "true",
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(timeout_s)],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "send-started"
    return proc, url


def read_until(proc: subprocess.Popen[str], line: str) -> str:
    """Return the server's output up to and including ``line`` (or all of it, if it exits first)."""
    assert proc.stdout is not None
    seen = []
    while (got := proc.stdout.readline()) and got.strip() != line:
        seen.append(got)
    return "".join(seen) + got


def sends_recorded(url: str) -> int:
    kv = connect(url)
    try:
        return KvCounterStore(kv).read().get("messages.out", 0)
    finally:
        kv.close()


def test_sigterm_waits_for_the_in_flight_send_then_exits(tmp_path: Path) -> None:
    proc, url = run_server(tmp_path, timeout_s=20)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        stopping = read_until(proc, "readyz 503")  # stopping, while the send still waits for its provider
        assert proc.stdin is not None
        proc.stdin.write("answer\n")
        proc.stdin.flush()
        out, _ = proc.communicate(timeout=30)
        out = stopping + out
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    lines = out.split()
    assert "send-done" in lines
    assert "readyz 503" in out
    assert time.monotonic() - started < 15
    assert sends_recorded(url) == 1


def test_sigterm_gives_up_after_the_drain_timeout(tmp_path: Path) -> None:
    proc, url = run_server(tmp_path, timeout_s=0.5)  # the provider never answers
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert time.monotonic() - started < 10
    assert proc.returncode == 1  # sends were cut off
    assert "send-done" not in out
    assert sends_recorded(url) == 0


@pytest.fixture
def not_stopping() -> Iterator[None]:
    """Clear the process-wide stopping flag after the test (other tests need /readyz ready)."""
    yield
    health._stopping.clear()


def test_readyz_answers_503_with_the_reason_while_stopping(db: None, not_stopping: None) -> None:
    assert health.readyz(RequestFactory().get("/readyz")).status_code == 200
    health.mark_stopping()
    response = health.readyz(RequestFactory().get("/readyz"))
    assert response.status_code == 503 and b"shutting down" in response.content


def test_drain_waits_for_every_in_flight_send(not_stopping: None) -> None:
    finished: list[int] = []
    answered = threading.Event()  # the sends' provider answers when the test says so

    def send(i: int) -> None:
        with shutdown.inflight():
            answered.wait(10)
            finished.append(i)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    wait_until(lambda: shutdown.inflight_count() == 3, "three sends in flight", timeout_s=10)
    assert shutdown.inflight_count() == 3
    drained: list[bool] = []
    drainer = threading.Thread(target=lambda: drained.append(shutdown.drain(5)))
    drainer.start()
    drainer.join(0.2)
    assert drainer.is_alive() and finished == []  # drain waits while the sends are in flight
    answered.set()
    drainer.join(10)
    assert drained == [True]  # shutdown.drain(5) is True
    assert sorted(finished) == [0, 1, 2] and shutdown.inflight_count() == 0
    with shutdown.inflight():
        assert shutdown.drain(0.05) is False


def test_stop_gracefully_flushes_counts_kept_during_an_outage(not_stopping: None) -> None:
    from .test_metrics import BrokenStore

    store = BrokenStore()
    with metrics.use_counter_store(store):
        metrics.count("messages.out")
        store.down = False
        assert shutdown.stop_gracefully(timeout_s=1) is True
        assert store.read() == {"messages.out": 1}
    assert health._stopping.is_set()


@pytest.mark.services
def test_worker_sigterm_finishes_the_running_send_records_it_once_and_keeps_its_trace(
    tmp_path: Path, redis_url: str
) -> None:
    """A real prefork worker (child initialised by worker_process_init) gets SIGTERM mid-send."""
    import uuid

    from celery import Celery
    from kombu import Connection

    from botmesh_admin.observability.stores.kv import KvTraceStore

    queue, prefix = f"obs-{uuid.uuid4().hex[:8]}", f"obs-{uuid.uuid4().hex[:8]}"
    url = f"sqlite:///{tmp_path}/kv.sqlite3"
    env = {
        **os.environ,
        "BOTMESH_KV_URL": url,
        "BOTMESH_DATA_DIR": str(tmp_path),
        "CELERY_BROKER_URL": redis_url,
        "OBS_QUEUE": queue,
        "OBS_PREFIX": prefix,
        "BOTMESH_DRAIN_TIMEOUT": "30",
        "DJANGO_SETTINGS_MODULE": "botmesh_admin.settings",
    }
    env.pop("REDIS_URL", None)
    env.pop("OTEL_SDK_DISABLED", None)
    log = tmp_path / "worker.log"
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.observability.worker_app",
            "worker",
            "-P",
            "prefork",
            "-c",
            "1",
            "-Q",
            queue,
            "-l",
            "INFO",
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
        ],
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    producer = Celery(set_as_current=False)  # never the process's current app: shared tasks would route by it
    # An explicit connection: the CELERY_BROKER_URL (memory://) of the test process wins over any conf.
    broker = Connection(redis_url, transport_options={"global_keyprefix": prefix + ":"})
    kv = connect(url)
    try:

        def alive(ready: Callable[[], bool]) -> Callable[[], bool]:
            def check() -> bool:
                assert worker.poll() is None, log.read_text()
                return ready()

            return check

        # a message sent before the queue exists is dropped
        wait_until(alive(lambda: "ready." in log.read_text()), "the worker to get ready", timeout_s=90)
        producer.send_task("tests.observability.slow_send", args=[60.0], queue=queue, connection=broker)
        wait_until(alive(lambda: kv.get("obs-proof/marks", "started") is not None), "the send to start", timeout_s=90)
        worker.send_signal(signal.SIGTERM)
        # the warm shutdown has begun while the send still waits for its provider; then it answers
        wait_until(lambda: "Warm shutdown" in log.read_text(), "the warm shutdown", timeout_s=30)
        kv.commit("obs-proof/marks", [Put("answer", 1)])
        assert worker.wait(timeout=60) == 0, log.read_text()
        assert KvCounterStore(kv).read().get("messages.out", 0) == 1, log.read_text()
        names = [t.name for t in KvTraceStore(kv).list(None, kind="task")[0]]
        assert any("tests.observability.slow_send" in n for n in names), (names, log.read_text())
    finally:
        if worker.poll() is None:
            worker.kill()
        broker.release()
        producer.close()
        kv.close()
