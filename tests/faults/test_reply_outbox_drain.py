"""SIGTERM drains the reply outbox without cutting sends off (issue 17, item 1, replies), with real Celery workers.

Replies go out through the events journal's ``outbox`` channel: a Celery
worker's ``events.drain`` task claims one record at a time and sends its reply.
Here three replies are queued on an embedded installation of the test's own
(SQLite database, Kv and journal, filesystem broker) and sent to a fake
provider that holds its answers back; every worker is ``celery -A
botmesh_admin worker -P prefork -c 1``, the production app, and SIGTERM goes to
its whole process group (as systemd sends it):

1. provider 4 s: SIGTERM while the first reply is in flight — it finishes and
   is recorded (accepted), no other reply starts, the worker exits 0;
2. provider 8 s, ``BOTMESH_DRAIN_TIMEOUT=1``: SIGTERM while the second is in
   flight — the worker is forced out, exits 1 and logs "1 send(s) cut off in
   flight"; the third never started;
3. a restarted worker sends the rest (the third); no reply reached the
   provider twice. (The one cut off is ``sending`` until its record's lease
   lapses; then it is marked not confirmed, never resent automatically —
   ``tests/inbox/test_reply_crash.py``.)
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from celery import Celery
from kombu import Connection

from botmesh_admin.channels.testing import FakeProviderServer
from botmesh_admin.kv import connect
from inbox.stores.kv import KvInboxStore
from tests.backends import unique_id
from tests.campaigns.test_sigterm_drain import FILESYSTEM_TRANSPORT, broker_options
from tests.polling import wait_until

from .servers import Processes, fault_report, python
from .test_frozen_reply_sender import reply_env, step

pytestmark = pytest.mark.slow

WORKER = [python(), "-m", "celery", "-A", "botmesh_admin", "worker", "-P", "prefork", "-c", "1", "-l", "INFO",
          "--without-mingle", "--without-gossip", "--without-heartbeat"]  # fmt: skip


def test_sigterm_finishes_the_reply_in_flight_a_forced_exit_says_it_cut_one_off_and_a_restart_sends_the_rest(
    tmp_path: Path,
) -> None:
    began = time.monotonic()
    env = {**reply_env(tmp_path), "CELERY_BROKER_URL": "filesystem://"}
    broker = tmp_path / "data" / "broker"
    tenant = unique_id("outbox")
    kv = connect(env["BOTMESH_KV_URL"])
    store = KvInboxStore(kv)
    producer = Celery("outbox-producer", set_as_current=False)

    def drain_outbox(queue: str) -> None:
        """Queue one ``events.drain`` of the outbox (what beat's safety net does every 5 s) on ``queue``."""
        with Connection("filesystem://", transport=FILESYSTEM_TRANSPORT,
                        transport_options=broker_options(broker)) as conn:  # fmt: skip
            producer.send_task("events.drain", kwargs={"channel": "outbox"}, connection=conn, retry=False,
                               queue=queue)  # fmt: skip

    def states() -> list[str]:
        return [store.message_get(tenant, i).reply.state for i in ids]  # type: ignore[union-attr]

    ids: list[str] = []
    with FakeProviderServer(delay_s=4.0) as fake, Processes(tmp_path) as procs:
        try:
            # The three workers load at once (seconds each), each on a queue of its own, so each runs
            # only the drain the test gives it (the replies' own drain tasks go to the default queue,
            # which none of them consumes).
            first = procs.start("worker-1", [*WORKER, "-n", "outbox-1@%h", "-Q", "faults-outbox-1"],
                                {**env, "BOTMESH_DRAIN_TIMEOUT": "20"})  # fmt: skip
            second = procs.start("worker-2", [*WORKER, "-n", "outbox-2@%h", "-Q", "faults-outbox-2"],
                                 {**env, "BOTMESH_DRAIN_TIMEOUT": "1"})  # fmt: skip
            third = procs.start("worker-3", [*WORKER, "-n", "outbox-3@%h", "-Q", "faults-outbox-3"], env)
            ids = step(env, "setup", tenant=tenant, base_url=fake.base_url, replies=3)["message_ids"]
            assert states() == ["queued"] * 3
            wait_until(lambda: "ready." in procs.log("worker-1"), "the first worker", timeout_s=60)
            drain_outbox("faults-outbox-1")
            wait_until(lambda: fake.count() >= 1, "the first reply to reach the provider", timeout_s=60)
            time.sleep(0.3)  # its request is out (the provider answers in 4 s)
            at_sigterm = fake.count()
            signalled = time.monotonic()
            os.killpg(first.pid, signal.SIGTERM)
            first_status = first.wait(timeout=30)
            first_s = time.monotonic() - signalled
            after_first = fake.count()
            drained = states()

            fake.set_delay(8.0)
            wait_until(lambda: "ready." in procs.log("worker-2"), "the second worker", timeout_s=60)
            drain_outbox("faults-outbox-2")
            wait_until(lambda: fake.count() >= 2, "the second reply to reach the provider", timeout_s=60)
            time.sleep(0.3)
            signalled = time.monotonic()
            os.killpg(second.pid, signal.SIGTERM)
            second_status = second.wait(timeout=30)
            second_s = time.monotonic() - signalled
            after_second = fake.count()
            forced = states()

            fake.set_delay(0.0)
            wait_until(lambda: "ready." in procs.log("worker-3"), "the third worker", timeout_s=60)
            drain_outbox("faults-outbox-3")
            wait_until(lambda: states()[2] == "accepted", "the restarted worker to send the rest", timeout_s=60)
            final = states()
            os.killpg(third.pid, signal.SIGTERM)
            third_status = third.wait(timeout=30)
        except BaseException:
            for name in ("worker-1", "worker-2", "worker-3"):
                print(f"--- {name}\n{procs.log(name)[-4000:]}")
            raise
        finally:
            producer.close()
        first_log, second_log = procs.log("worker-1"), procs.log("worker-2")
        per_reply = Counter(r.headers.get("idempotency-key") for r in fake.requests)
    kv.close()
    fault_report(
        f"FAULT sigterm-reply-outbox: 3 replies; drain (provider 4 s): requests at SIGTERM {at_sigterm}, after it "
        f"{after_first - at_sigterm}, replies {Counter(drained)}, exit {first_status} after {first_s:.1f} s; "
        f"forced (provider 8 s, drain timeout 1 s): requests after SIGTERM {after_second - 2}, replies "
        f"{Counter(forced)}, exit {second_status} after {second_s:.1f} s; after restart {Counter(final)}, sent "
        f"{sum(per_reply.values())}, duplicates {sum(n - 1 for n in per_reply.values())}, in doubt "
        f"{final.count('sending')}; {time.monotonic() - began:.1f} s"
    )
    assert after_first == at_sigterm == 1, "no reply send starts after the SIGTERM"
    assert drained == ["accepted", "queued", "queued"], "the reply in flight finished and was recorded"
    assert first_status == 0, first_log
    assert after_second == 2
    assert forced == ["accepted", "sending", "queued"]
    assert second_status == 1, second_log
    assert "1 send(s) cut off in flight" in second_log, second_log
    assert second_s < 8, "forced out at the drain timeout, not after the provider answered"
    assert final == ["accepted", "sending", "accepted"]
    assert len(per_reply) == 3 and set(per_reply.values()) == {1}, per_reply
    assert third_status == 0
