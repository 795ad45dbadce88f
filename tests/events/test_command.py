"""``manage.py botmesh_events_worker``: drains its channel and stops gracefully on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from botmesh_admin.events import Envelope, EventJournal, connect_journal

ROOT = Path(__file__).resolve().parents[2]


def _output_of_stopped(proc: subprocess.Popen[str]) -> str:
    """Return the stderr of ``proc`` after killing it (reading a live process's stderr would wait for ever)."""
    if proc.poll() is None:
        proc.kill()
    return proc.communicate(timeout=10)[1]


def _slow_worker(
    tmp_path: Path, channel: str, sleep_s: float, prefix: str
) -> tuple[subprocess.Popen[str], EventJournal, Path]:
    """Journal three ``test.slow`` records on ``channel`` and start a worker whose handler sleeps ``sleep_s`` seconds.

    Return ``(worker, journal, handler log)`` once the handler has started its first record.
    """
    url = f"sqlite:///{tmp_path}/journal.sqlite3"
    log = tmp_path / "handler.log"
    journal = connect_journal(url)
    for n in range(3):
        journal.append(
            Envelope(type="test.slow", tenant="acme", payload={}, idempotency_key=f"{prefix}{n}", channel=channel)
        )
    env = {
        **os.environ, "BOTMESH_JOURNAL_URL": url, "BOTMESH_TEST_HANDLER_LOG": str(log),
        "BOTMESH_TEST_HANDLER_SLEEP": str(sleep_s), "PYTHONPATH": str(ROOT),
    }  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "botmesh_events_worker", "--channel", channel,
         "--handler", "tests.events.slow_handler.handle", "--idle-ms", "50"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not (log.exists() and "start" in log.read_text()):
        if time.monotonic() >= deadline or proc.poll() is not None:
            journal.close()
            raise AssertionError(_output_of_stopped(proc))
        time.sleep(0.05)
    return proc, journal, log


def test_sigterm_finishes_the_record_in_hand_then_exits(tmp_path: Path) -> None:
    proc, journal, log = _slow_worker(tmp_path, "outbox", 1.5, "s")
    try:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "1 processed" in out
    lines = log.read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["start", "end"]  # finished, took no other
    states = sorted(r.state for r in journal.list(tenant="acme"))
    assert states == ["done", "pending", "pending"]
    journal.close()


def test_a_bad_channel_is_refused() -> None:
    with pytest.raises(CommandError, match="--channel"):
        call_command("botmesh_events_worker", channel="Not Valid")


def test_a_campaigns_run_worker_claims_one_record_at_a_time(tmp_path: Path) -> None:
    # Each run may take hours: a worker holding 20 of them (and renewing their leases) would starve the others.
    proc, journal, _ = _slow_worker(tmp_path, "campaigns-run", 3, "r")
    try:
        states = sorted(r.state for r in journal.list(tenant="acme"))
    finally:
        proc.kill()
        proc.communicate(timeout=10)
        journal.close()
    assert states == ["leased", "pending", "pending"]  # one run in hand; the others free for another worker


@pytest.mark.slow  # six worker processes started one after another (~15 s alone, more on a busy machine)
def test_a_poison_record_that_kills_the_worker_mid_batch_ends_dead_and_its_neighbours_done(tmp_path: Path) -> None:
    # The worker claims the six records in one batch and is SIGKILLed by the third; restarted after each death.
    url = f"sqlite:///{tmp_path}/journal.sqlite3"
    log = tmp_path / "handler.log"
    log.touch()
    journal = connect_journal(url)
    keys = ["n0", "n1", "poison", "n2", "n3", "n4"]
    for key in keys:
        payload = {"poison": True} if key == "poison" else {}
        journal.append(Envelope(type="test.poison", tenant="acme", payload=payload, idempotency_key=key))
        time.sleep(0.003)  # claim order = append order
    env = {**os.environ, "BOTMESH_JOURNAL_URL": url, "BOTMESH_TEST_HANDLER_LOG": str(log), "PYTHONPATH": str(ROOT)}
    deaths = 0
    try:
        for _ in range(journal.policy.max_attempts + 4):
            states = {r.idempotency_key: r.state for r in journal.list(tenant="acme")}
            if all(state in ("done", "dead") for state in states.values()):
                break
            proc = subprocess.Popen(
                [sys.executable, "manage.py", "botmesh_events_worker", "--handler", "tests.events.slow_handler.poison",
                 "--idle-ms", "50", "--lease-ms", "400"],
                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            try:
                deadline = time.monotonic() + 20
                while proc.poll() is None and time.monotonic() < deadline:
                    states = {r.idempotency_key: r.state for r in journal.list(tenant="acme")}
                    if all(state in ("done", "dead") for state in states.values()):
                        break
                    time.sleep(0.05)
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.communicate(timeout=10)
            deaths += proc.returncode == -signal.SIGKILL
            time.sleep(0.45)  # the dead worker's leases lapse
        records = {r.idempotency_key: r for r in journal.list(tenant="acme")}
    finally:
        journal.close()
    ran = log.read_text().split()
    assert records["poison"].state == "dead", records["poison"]
    assert {k: r.state for k, r in records.items() if k != "poison"} == dict.fromkeys(keys[:2] + keys[3:], "done")
    assert all(ran.count(k) in (1, 2) for k in keys if k != "poison"), ran  # each ran at most twice
    assert deaths >= 1
