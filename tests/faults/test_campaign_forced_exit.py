"""A Celery worker forced out mid-campaign exits non-zero and says how many sends it cut off (issue 17, item 1).

The drained case (SIGTERM, the batch in flight finishes, exit 0, the next
worker sends the rest) is ``tests/campaigns/test_sigterm_drain.py``; this one
uses its setup (a prefork worker with one pool child on an embedded setup of
the test's own, batches of ``BATCH``). What failed: the worker forced out at
``BOTMESH_DRAIN_TIMEOUT`` exited with status 0 and no word of the sends the
provider had accepted. Here the fake provider answers in 8 s and the drain
timeout is 1 s: SIGTERM while the first batch is out → the worker is forced
out about 1 s later, kills its pool child, exits 1 and logs "<BATCH> send(s)
cut off in flight"; no request leaves after the SIGTERM and nothing is
recorded accepted that the worker did not see answered.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from celery import Celery

from botmesh_admin.channels.testing import FakeProviderServer
from botmesh_admin.kv.runtime import use_kv
from tests.campaigns.drain_app import BATCH
from tests.campaigns.test_sigterm_drain import N, deliveries, run_campaign, started_campaign, states
from tests.polling import wait_until

from .servers import Processes, fault_report

pytestmark = pytest.mark.slow

PROVIDER_S = 8.0


def test_a_worker_forced_out_mid_campaign_exits_1_and_logs_the_sends_it_cut_off(tmp_path: Path, db: None) -> None:
    began = time.monotonic()
    kv, tenant, campaign_id, env, argv = started_campaign(tmp_path, drain_timeout_s=1)
    producer = Celery("forced-producer", set_as_current=False)
    with FakeProviderServer(delay_s=PROVIDER_S) as fake, Processes(tmp_path) as procs, use_kv(kv):
        env = {**env, "DRAIN_PROVIDER_URL": fake.base_url}
        try:
            worker = procs.start("worker", [*argv, "-n", "forced@%h"], env)
            run_campaign(producer, tmp_path)
            wait_until(lambda: fake.count() >= BATCH, "the first batch to reach the provider", timeout_s=60)
            time.sleep(0.3)
            at_sigterm = fake.count()
            signalled = time.monotonic()
            os.killpg(worker.pid, signal.SIGTERM)
            status = worker.wait(timeout=30)
            exit_s = time.monotonic() - signalled
            time.sleep(0.5)  # a request the killed pool child would still make is recorded by now
            after_exit = fake.count()
            stopped = deliveries(tenant, campaign_id)
        except BaseException:
            print(procs.log("worker")[-6000:])
            raise
        finally:
            producer.close()
        log = procs.log("worker")
    kv.close()
    counts = states(stopped)
    fault_report(f"FAULT forced-exit-mid-campaign: {N} recipients in batches of {BATCH}, provider {PROVIDER_S:g} s, "
                 f"drain timeout 1 s; requests at SIGTERM {at_sigterm}, after it {after_exit - at_sigterm}; exit "
                 f"status {status} after {exit_s:.1f} s; deliveries {counts}, in doubt {N - counts.get('pending', 0)}; "
                 f"{time.monotonic() - began:.1f} s")  # fmt: skip
    assert status == 1, log
    assert f"{BATCH} send(s) cut off in flight" in log, log
    assert exit_s < PROVIDER_S - 2, "forced out at the drain timeout, not when the provider answered"
    assert after_exit == at_sigterm == BATCH, "no request leaves after the SIGTERM"
    assert counts.get("pending") == N - BATCH and "accepted" not in counts, counts
