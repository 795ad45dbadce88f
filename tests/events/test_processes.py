"""Worker processes against the journals several processes share (SQLite, PostgreSQL, Redis).

Four worker processes drain 2,000 events: without failures each event is
handled exactly once; with one worker killed by SIGKILL in the middle of a
handler every event is still handled (at least once), none is lost, and the
killed worker's late ack is refused. Every wait is bounded.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

from botmesh_admin.events import Envelope, EventJournal, StaleLeaseError, connect_journal
from botmesh_admin.events.base import MAX_BATCH
from tests.polling import wait_until

from . import journals
from .conftest import backend_params

ROOT = Path(__file__).resolve().parents[2]
EVENTS = 2000
WORKERS = 4
DEADLINE_S = 90


@pytest.fixture(params=backend_params(journals.SHARED))
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh journal several processes can open. Server-side fsync is relaxed for speed:
    these tests kill worker processes, not the database server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/journal.sqlite3?synchronous=normal"
    if request.param == "postgresql":
        base = request.getfixturevalue("postgres_url")
        url = journals.with_namespace(f"{base}?options=-c%20synchronous_commit%3Doff")
    else:
        url = journals.with_namespace(request.getfixturevalue("redis_url"))
    request.addfinalizer(lambda: journals.drop(url))
    return url


def fill(journal: EventJournal, tenant: str, *, batched: bool = False) -> set[str]:
    """Append ``EVENTS`` test events, one commit each or (``batched``) one commit per ``MAX_BATCH``."""
    envelopes = [
        Envelope(type="test.event", tenant=tenant, payload={"n": n}, idempotency_key=f"n{n}") for n in range(EVENTS)
    ]
    if not batched:
        return {journal.append(envelope).id for envelope in envelopes}
    step = MAX_BATCH
    return {record.id for i in range(0, EVENTS, step) for record in journal.append_many(envelopes[i : i + step])}


def start_worker(url: str, log: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.events.workers", url, str(log), *extra],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


# The processes whose "ready" line was read: the Popen objects, not their pids — a pid the kernel
# reuses (pid_max is 32768 here) would let a new worker's "ready" go unread and a SIGTERM reach it
# while it still imports Django.
_ready: weakref.WeakSet[subprocess.Popen[str]] = weakref.WeakSet()


def wait_ready(procs: list[subprocess.Popen[str]]) -> None:
    """Block until every worker printed "ready" (its SIGTERM handler installed, its journal open)."""
    for proc in procs:
        if proc not in _ready and proc.poll() is None and proc.stdout is not None:
            proc.stdout.readline()
            _ready.add(proc)


def stop_all(procs: list[subprocess.Popen[str]]) -> None:
    # Wait for "ready" first: under load a worker still importing Django was killed by
    # SIGTERM's default handler and exited -15.
    wait_ready(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            # Longer than SQLite's 30 s busy timeout: a worker waiting for the lock (held by a process
            # the loaded machine left unscheduled) handles SIGTERM only once its statement returns.
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def handled(logs: list[Path]) -> collections.Counter[str]:
    seen: collections.Counter[str] = collections.Counter()
    for log in logs:
        if log.exists():
            for line in log.read_text().splitlines():
                if not line.startswith("HANG"):
                    seen[line.split()[0]] += 1
    return seen


def done(journal: EventJournal, tenant: str) -> int:
    return journal.counts(tenant).get(("done", None), 0)


def test_four_workers_handle_every_event_exactly_once(shared_url: str, tmp_path: Path, tenant_id: str) -> None:
    journal = connect_journal(shared_url)
    logs = [tmp_path / f"worker{i}.log" for i in range(WORKERS)]
    procs = [start_worker(shared_url, log, "--lease-ms", "30000") for log in logs]
    try:
        # Every worker polls before the events arrive: with batched claims the first worker up
        # could otherwise drain the whole backlog while the others still import Django.
        wait_ready(procs)
        ids = fill(journal, tenant_id, batched=True)
        wait_until(lambda: done(journal, tenant_id) == EVENTS, "every event done", DEADLINE_S)
    finally:
        stop_all(procs)
        journal.close()
    for proc in procs:
        assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    seen = handled(logs)
    assert set(seen) == ids
    assert max(seen.values()) == 1, [i for i, n in seen.items() if n > 1][:5]
    assert sum(1 for log in logs if log.exists() and log.stat().st_size) >= 2  # the work was shared


def test_a_worker_killed_mid_handler_loses_nothing_and_its_late_ack_is_refused(
    shared_url: str, tmp_path: Path, tenant_id: str
) -> None:
    journal = connect_journal(shared_url)
    ids = fill(journal, tenant_id)
    logs = [tmp_path / f"worker{i}.log" for i in range(WORKERS)]
    victim = start_worker(shared_url, logs[0], "--lease-ms", "1500", "--hang-at", "40")
    procs = [victim]
    try:
        # The victim polls alone until it hangs: started together, one survivor up first drained all
        # 2,000 events in batched claims before the victim had handled 40 (2 runs in 20 under load).
        wait_ready([victim])
        wait_until(lambda: logs[0].exists() and "HANG" in logs[0].read_text(), "the victim to hang", DEADLINE_S)
        procs += [start_worker(shared_url, log, "--lease-ms", "1500") for log in logs[1:]]
        wait_ready(procs)  # the survivors poll when the victim dies, its lease renewed until then
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        wait_until(lambda: done(journal, tenant_id) == EVENTS, "every event done", DEADLINE_S)
    finally:
        stop_all(procs)
    hang = next(line for line in logs[0].read_text().splitlines() if line.startswith("HANG"))
    _, hung_id, hung_token = hang.split()
    seen = handled(logs)
    assert set(seen) == ids  # every event handled at least once, the hung one by a survivor
    assert seen[hung_id] >= 1
    assert victim.returncode == -signal.SIGKILL
    record = journal.get(hung_id)
    assert record.state == "done" and record.fencing_token > int(hung_token)
    with pytest.raises(StaleLeaseError):
        journal.ack(hung_id, journal.clock(), int(hung_token))
    assert journal.get(hung_id) == record
    journal.close()
