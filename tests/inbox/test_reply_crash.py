"""A worker SIGKILLed between a reply's request and its record never sends it twice (real processes).

The installation is the embedded default's layout (SQLite database, Kv and
journal files in one directory) shared by separate processes: ``replyproc
setup`` queues an agent's reply; ``manage.py botmesh_events_worker --channel
outbox`` — the production worker command — sends it to a ``FakeProviderServer``
that holds the answer back, and is killed with SIGKILL while the request is in
flight. A second worker started afterwards claims the record once the lease
has expired, finds the reply ``sending`` and marks it ``not_confirmed``
without a second request; only the agent's resend sends again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from botmesh_admin.channels.testing import FakeProviderServer
from botmesh_admin.kv import connect
from inbox.stores.kv import KvInboxStore
from tests.backends import unique_id
from tests.polling import wait_until

ROOT = Path(__file__).resolve().parents[2]
RECIPIENT = "573001112233"
LEASE_MS = 1500


@pytest.fixture
def installation(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BOTMESH_", "OTEL_", "CELERY_"))}
    if "BOTMESH_FIXTURES" in os.environ:  # where the shared fixtures are, for a clone outside the workspace
        env["BOTMESH_FIXTURES"] = os.environ["BOTMESH_FIXTURES"]
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "botmesh_admin.settings",
            "BOTMESH_DATA_DIR": str(tmp_path),
            "DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite3",
            "BOTMESH_KV_URL": f"sqlite:///{tmp_path}/kv.sqlite3",
            "BOTMESH_JOURNAL_URL": f"sqlite:///{tmp_path}/journal.sqlite3",
            "CELERY_BROKER_URL": "memory://",
        }
    )
    env.pop("REDIS_URL", None)
    kv = connect(env["BOTMESH_KV_URL"])
    yield env, KvInboxStore(kv)
    kv.close()


def step(env: dict[str, str], name: str, **args) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "tests.inbox.replyproc", name, json.dumps(args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def worker(env: dict[str, str], *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "botmesh_events_worker",
            "--channel",
            "outbox",
            "--lease-ms",
            str(LEASE_MS),
            "--idle-ms",
            "50",
            *extra,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_worker_killed_mid_request_never_sends_twice_and_the_agent_can_resend(installation):
    env, store = installation
    tenant = unique_id("crash")
    with FakeProviderServer() as fake:
        fake.set_delay(5.0, RECIPIENT)  # the answer is held back: the kill lands while the request is in flight
        ids = step(env, "setup", tenant=tenant, base_url=fake.base_url)
        assert store.message_get(tenant, ids["message_id"]).reply.state == "queued"

        first = worker(env)
        try:
            wait_until(lambda: fake.count(RECIPIENT) == 1, "the request to reach the provider", 60, interval_s=0.02)
            assert store.message_get(tenant, ids["message_id"]).reply.state == "sending"
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=10)
        assert first.returncode == -signal.SIGKILL

        second = worker(env, "--max-events", "1")  # claims the record once the killed worker's lease expired
        out, _ = second.communicate(timeout=60)
        assert second.returncode == 0, out
        assert "1 processed" in out
        reply = store.message_get(tenant, ids["message_id"]).reply
        assert reply.state == "not_confirmed"
        assert "may or may not have been delivered" in reply.error_title
        assert fake.count(RECIPIENT) == 1, "the reply was not sent a second time"

        # Only the agent's explicit resend sends again, under a new idempotency key.
        fake.set_delay(0.0, RECIPIENT)
        resent = step(
            env, "resend", tenant=tenant, message_id=ids["message_id"], conversation_id=ids["conversation_id"]
        )
        assert resent == {"queued": "queued", "drained": {"processed": 1, "failed": 0, "stale": 0}}
        message = store.message_get(tenant, ids["message_id"])
        assert message.reply.state == "accepted" and message.provider_message_id.startswith("wamid.")
        assert fake.count(RECIPIENT) == 2
        first_key, second_key = (r.headers["idempotency-key"] for r in fake.requests)
        assert second_key == f"{first_key}:resend2"
