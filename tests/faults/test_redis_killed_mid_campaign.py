"""Redis SIGKILLed mid-campaign: no recipient gets two provider requests (issue 17, item 6).

This held before issue 17 (500 recipients, Redis killed with and without AOF:
0 with two requests); kept as a bounded real-process test. A Celery worker
(prefork, one pool child; ``tests.campaigns.drain_app``) consumes the campaign's
run (the drain of its journal event) from a Redis of the test's own, which is also the installation's
``REDIS_URL``; the Kv is SQLite. While the first batch is at the fake provider
(1 s answers), Redis is SIGKILLed, and started again (same port and
append-only file) a second later. The campaign must complete — every recipient
asked exactly once, however often the run was delivered — and the worker
must still run.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
from celery import Celery

from botmesh_admin.channels.testing import FakeProviderServer
from botmesh_admin.kv.runtime import use_kv
from campaigns import selectors
from campaigns.domain import RUN_CHANNEL
from tests.campaigns.drain_app import BATCH
from tests.campaigns.test_sigterm_drain import ADDRESSES, N, deliveries, started_campaign, states
from tests.polling import wait_until

from .servers import Processes, fault_report

pytestmark = pytest.mark.slow


def test_redis_sigkilled_mid_campaign_sends_every_recipient_exactly_once(tmp_path: Path, db: None) -> None:
    began = time.monotonic()
    kv, tenant, campaign_id, env, argv = started_campaign(tmp_path)
    producer = Celery("redis-campaign-producer", set_as_current=False)
    with FakeProviderServer(delay_s=1.0) as fake, Processes(tmp_path) as procs, use_kv(kv):
        redis = procs.redis()
        env = {**env, "CELERY_BROKER_URL": redis.url, "REDIS_URL": redis.url, "DRAIN_PROVIDER_URL": fake.base_url}
        try:
            worker = procs.start("worker", [*argv, "-n", "redis-campaign@%h"], env)
            wait_until(lambda: "ready." in procs.log("worker"), "the worker", timeout_s=60)
            with producer.connection_for_write(redis.url) as connection:
                producer.send_task("events.drain", kwargs={"channel": RUN_CHANNEL}, connection=connection, retry=False)
            wait_until(lambda: fake.count() >= 1, "the first batch to reach the provider", timeout_s=60)
            redis.kill()
            at_kill = fake.count()
            time.sleep(1.0)
            redis.start()
            wait_until(lambda: selectors.campaign_get(tenant, campaign_id).state == "completed",
                       "the campaign to complete after Redis came back", timeout_s=60)  # fmt: skip
            time.sleep(1.0)  # a redelivered run (the restored unacked message) would ask again by now
            final = deliveries(tenant, campaign_id)
            alive = worker.poll() is None
        except BaseException:
            print(procs.log("worker")[-6000:])
            raise
        finally:
            producer.close()
        log = procs.log("worker")
        per_recipient = Counter({a: fake.count(a) for a in ADDRESSES})
    kv.close()
    runs = log.count("Task events.drain[")  # "received" and "succeeded" lines of each delivery
    fault_report(f"FAULT redis-killed-mid-campaign: {N} recipients in batches of {BATCH}, provider 1 s, AOF on; "
                 f"requests at the kill {at_kill}; sent {sum(per_recipient.values())}, deliveries {states(final)}, "
                 f"recipients asked twice {sum(c > 1 for c in per_recipient.values())}, never asked "
                 f"{sum(c == 0 for c in per_recipient.values())}, run task log lines {runs}, worker alive {alive}; "
                 f"{time.monotonic() - began:.1f} s")  # fmt: skip
    assert states(final) == {"accepted": N}, final
    assert set(per_recipient.values()) == {1}, per_recipient
    assert alive, log[-3000:]
