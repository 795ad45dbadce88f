"""A reply sender frozen past its outbox lease never reaches the provider after a takeover (issue 15, item 6).

What failed: ``reply_send`` received the journal record's fencing token and
ignored it. A worker frozen (SIGSTOP, a long GC or VM pause) after it marked a
reply ``sending`` and before its request woke up after another worker had
taken the record over and — the agent having resent the reply it found not
confirmed — sent it: the frozen one sent too, and the customer got the reply twice.

Real processes over the embedded layout of the test's own (SQLite database,
Kv and journal): ``botmesh_events_worker --channel outbox`` (lease 1.5 s) with
a handler that pauses right after the durable ``sending``
(``tests/faults/paused_reply.py``) is frozen there with SIGSTOP; past the
lease another worker takes the record over (finds the reply ``sending``: not
confirmed), the agent resends it and that worker sends it; then the frozen one
resumes (SIGCONT). Its claim check before the request fails: the fake
provider sees exactly one request.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from botmesh_admin.channels.testing import FakeProviderServer
from botmesh_admin.kv import connect
from inbox.stores.kv import KvInboxStore
from tests.backends import unique_id
from tests.polling import wait_until

from .servers import ROOT, Processes, fault_report, project_env, python

pytestmark = pytest.mark.slow

LEASE_MS = 1500


def reply_env(tmp_path: Path) -> dict[str, str]:
    """The embedded installation of a reply test: database, Kv and journal in SQLite files under ``tmp_path``."""
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    return {**project_env(tmp_path), "BOTMESH_KV_URL": f"sqlite:///{data}/kv.sqlite3",
            "BOTMESH_JOURNAL_URL": f"sqlite:///{data}/journal.sqlite3", "CELERY_BROKER_URL": "memory://",
            "FAULTS_DIR": str(tmp_path)}  # fmt: skip


def step(env: dict[str, str], name: str, **args: object) -> dict:
    """Run one ``tests.faults.reply_steps`` step in a process of its own; return its JSON answer."""
    done = subprocess.run([python(), "-m", "tests.faults.reply_steps", name, json.dumps(args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_sender_frozen_past_its_lease_does_not_send_after_another_worker_took_over(tmp_path: Path) -> None:
    began = time.monotonic()
    env = reply_env(tmp_path)
    tenant = unique_id("frozen")
    kv = connect(env["BOTMESH_KV_URL"])
    store = KvInboxStore(kv)
    with FakeProviderServer() as fake, Processes(tmp_path) as procs:
        paused = tmp_path / "paused.log"
        # Everything that takes seconds to load starts at once: the worker (it waits for the reply),
        # the worker that will take over (it waits for the word) and the setup.
        first = procs.start("worker-1", [python(), "manage.py", "botmesh_events_worker", "--channel", "outbox",
                                         "--lease-ms", str(LEASE_MS), "--idle-ms", "50",
                                         "--handler", "tests.faults.paused_reply.handle"], env)  # fmt: skip
        frozen = False
        takeover: subprocess.Popen[str] | None = None
        try:
            ids = step(env, "setup", tenant=tenant, base_url=fake.base_url)
            message_id = ids["message_ids"][0]
            takeover = subprocess.Popen(
                [python(), "-m", "tests.faults.reply_steps", "takeover", json.dumps(
                    {"tenant": tenant, "message_id": message_id, "lease_ms": LEASE_MS, "wait_go": True})],
                cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            wait_until(lambda: paused.exists() and message_id in paused.read_text(), "the reply marked sending",
                       timeout_s=60, interval_s=0.02)  # fmt: skip
            os.killpg(first.pid, signal.SIGSTOP)  # during its pause: after "sending", before the request
            frozen = True
            lapsed_at = time.monotonic() + LEASE_MS / 1000 + 0.5  # the frozen worker's lease (its heartbeat too)
            assert takeover.stdout is not None and takeover.stdout.readline().strip() == "READY"
            time.sleep(max(0.0, lapsed_at - time.monotonic()))
            out, _ = takeover.communicate("go\n", timeout=60)
            assert takeover.returncode == 0, out
            taken = json.loads(out.strip().splitlines()[-1])
            requests_before_resume = fake.count()
            (tmp_path / "resume").touch()
            os.killpg(first.pid, signal.SIGCONT)
            frozen = False
            wait_until(lambda: "lost before the provider request" in procs.log("worker-1") or fake.count() > 1,
                       "the resumed worker to check its claim", timeout_s=30)  # fmt: skip
            time.sleep(0.5)  # a request it would make after that is recorded by now
            requests = fake.count()
            final = store.message_get(tenant, message_id)
        except BaseException:
            print(procs.log("worker-1")[-4000:])
            raise
        finally:
            (tmp_path / "resume").touch()
            if frozen:
                os.killpg(first.pid, signal.SIGCONT)  # a frozen process cannot act on the SIGTERM that stops it
            if takeover is not None and takeover.poll() is None:
                takeover.kill()
                takeover.wait(timeout=5)
        first_log = procs.log("worker-1")
        keys = [r.headers.get("idempotency-key") for r in fake.requests]
    kv.close()
    assert final is not None and final.reply is not None
    fault_report(f"FAULT frozen-reply-sender: lease {LEASE_MS} ms; takeover found {taken['found']}, resent and "
                 f"sent {taken.get('resent')}; provider requests before resume {requests_before_resume}, after "
                 f"resume {requests}; duplicates {requests - 1}; reply {final.reply.state}, "
                 f"{time.monotonic() - began:.1f} s")  # fmt: skip
    assert taken["drained"]["processed"] == 1 and taken["found"] == "not_confirmed"
    assert taken["resent"] == {"processed": 1, "failed": 0, "stale": 0}
    assert requests_before_resume == 1
    assert requests == 1, f"the frozen worker reached the provider after the takeover: {keys}"
    assert final.reply.state == "accepted" and final.provider_message_id
    assert "lost before the provider request; not sent" in first_log, first_log
