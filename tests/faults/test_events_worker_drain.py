"""``botmesh_events_worker`` under SIGTERM with a record that outlasts the drain timeout (issue 17, item 1).

The drained case (the record in hand finishes, no other starts, exit 0) is
``tests/events/test_command.py``. Here the handler takes 8 s and
``BOTMESH_DRAIN_TIMEOUT`` is 1 s: the worker is forced out, exits non-zero and
logs that it cut the record off; the record is not acked (its lease lapses and
the journal redelivers it) and the next record never started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from botmesh_admin.events import Envelope, connect_journal

from .servers import ROOT, fault_report, python

pytestmark = pytest.mark.slow


def test_a_forced_exit_that_cuts_the_record_in_hand_off_exits_1_and_says_so(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/journal.sqlite3"
    log = tmp_path / "handler.log"
    journal = connect_journal(url)
    for n in range(2):
        journal.append(Envelope(type="test.slow", tenant="acme", payload={}, idempotency_key=f"f{n}", channel="outbox"))
    env = {**os.environ, "BOTMESH_JOURNAL_URL": url, "BOTMESH_TEST_HANDLER_LOG": str(log),
           "BOTMESH_TEST_HANDLER_SLEEP": "8", "BOTMESH_DRAIN_TIMEOUT": "1", "PYTHONPATH": str(ROOT)}  # fmt: skip
    proc = subprocess.Popen(
        [python(), "manage.py", "botmesh_events_worker", "--channel", "outbox",
         "--handler", "tests.events.slow_handler.handle", "--idle-ms", "50"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (log.exists() and "start" in log.read_text()):
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[1]
            time.sleep(0.05)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
        exit_s = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
    states = sorted(r.state for r in journal.list(tenant="acme"))
    journal.close()
    lines = log.read_text().splitlines()
    fault_report(f"FAULT events-worker-forced-exit: drain timeout 1 s, handler 8 s; exit status {proc.returncode} "
                 f"after {exit_s:.1f} s, records started {sum(x.startswith('start') for x in lines)}, "
                 f"finished {sum(x.startswith('end') for x in lines)}, journal {states}")  # fmt: skip
    assert proc.returncode == 1, err
    assert "1 record in hand cut off" in err, err
    assert exit_s < 5
    assert [line.split()[0] for line in lines] == ["start"]  # cut off, and no other record started
    assert "done" not in states
