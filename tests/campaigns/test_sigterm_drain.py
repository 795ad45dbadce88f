"""SIGTERM drains a campaign without cutting sends off (issue 17, item 1), with real Celery workers.

What failed: a SIGTERM to the worker during a 3-batch campaign to a slow
provider let the pool child start the next batch, the worker was forced out
with status 0, and sends the provider accepted ended ``in_doubt``.

Here a prefork worker (one pool child) runs the campaign on an embedded setup
of the test's own (SQLite Kv, filesystem broker) against a fake provider that
answers in 2 s. SIGTERM goes to the worker's whole process group (as systemd
sends it) while the first batch is out: no request leaves after it, the batch
in flight is recorded (accepted, none in doubt), the worker exits 0, and the
run is requeued (its successor journal event); a second worker sends the rest, nobody twice.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from kombu import Connection

from botmesh_admin.channels.testing import FakeProviderServer
from botmesh_admin.events import connect_journal
from botmesh_admin.events.runtime import use_journal
from botmesh_admin.kv import connect
from botmesh_admin.kv.runtime import use_kv
from campaigns import selectors, services
from campaigns.domain import RUN_CHANNEL
from crm import selectors as crm_selectors
from crm import services as crm
from crm.domain import Consent, Contact, Identity, new_id
from crm.stores.kv import KvContactStore
from tests.backends import unique_id
from tests.faults.servers import Processes, fault_report, project_env, python
from tests.polling import wait_until

from .drain_app import BATCH

pytestmark = [pytest.mark.slow]

N = 3 * BATCH
ADDRESSES = [f"+5731{i:08d}" for i in range(N)]
FILESYSTEM_TRANSPORT = "botmesh_admin.filesystem_broker:Transport"


def broker_options(broker: Path) -> dict[str, object]:
    """The transport options ``settings.py`` gives the filesystem broker in ``broker``."""
    return {
        "data_folder_in": str(broker / "queue"), "data_folder_out": str(broker / "queue"),
        "processed_folder": str(broker / "processed"), "control_folder": str(broker / "control"),
        "corrupt_folder": str(broker / "corrupt"), "store_processed": False,
    }  # fmt: skip


def deliveries(tenant: str, campaign_id: str) -> dict[str, str]:
    """recipient → state, every delivery of the campaign."""
    out: dict[str, str] = {}
    after = None
    while True:
        page = selectors.delivery_list(tenant, campaign_id, limit=200, after=after)
        out.update({d.recipient: d.state for d in page.items})
        if page.next is None:
            return out
        after = page.next


def states(got: dict[str, str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for state in got.values():
        counts[state] = counts.get(state, 0) + 1
    return counts


def started_campaign(tmp_path: Path, *, drain_timeout_s: int = 20) -> tuple[Any, str, str, dict[str, str], list[str]]:
    """A started campaign to ``ADDRESSES`` on an embedded setup under ``tmp_path``.

    Return ``(kv, tenant, campaign id, the workers' environment, the worker argv)``.
    """
    data = tmp_path / "data"
    broker = data / "broker"
    for name in ("queue", "processed", "control"):
        (broker / name).mkdir(parents=True)
    kv_url = f"sqlite:///{data}/kv.sqlite3"
    kv = connect(kv_url)
    tenant = unique_id("drain")
    crm_selectors._regions[tenant] = ("CO", float("inf"))
    store = KvContactStore(kv)
    for i, address in enumerate(ADDRESSES):
        store.contact_insert(tenant, Contact(
            id=new_id("c"), identities=(Identity("whatsapp", address),), name=f"Cliente {i}", tags=("promo",),
            consent={"whatsapp": Consent("whatsapp", "granted", 1, "test")}, created_at=1, updated_at=1,
        ))  # fmt: skip
    journal = connect_journal(f"sqlite:///{data}/journal.sqlite3")
    with use_kv(kv), use_journal(journal):  # the run event goes into the workers' journal
        segment = crm.segment_create(tenant, name="Promo", rules={"tags_all": ["promo"]})
        campaign = services.campaign_create(tenant, name="drain", segment_id=segment.id, channel="whatsapp",
                                            message={"template": "promo_nov", "language": "es"})  # fmt: skip
        services.campaign_start(tenant, campaign.id)
    journal.close()
    env = {**project_env(tmp_path), "CELERY_BROKER_URL": "filesystem://", "BOTMESH_KV_URL": kv_url,
           "BOTMESH_JOURNAL_URL": f"sqlite:///{data}/journal.sqlite3",
           "BOTMESH_DRAIN_TIMEOUT": str(drain_timeout_s)}  # fmt: skip
    argv = [python(), "-m", "celery", "-A", "tests.campaigns.drain_app", "worker", "-P", "prefork", "-c", "1",
            "-l", "INFO", "--without-mingle", "--without-gossip", "--without-heartbeat"]  # fmt: skip
    return kv, tenant, campaign.id, env, argv


def run_campaign(producer: Celery, tmp_path: Path) -> None:
    """Queue the drain of the campaign runs' journal channel in the filesystem broker under ``tmp_path``."""
    with Connection("filesystem://", transport=FILESYSTEM_TRANSPORT,
                    transport_options=broker_options(tmp_path / "data" / "broker")) as conn:  # fmt: skip
        producer.send_task("events.drain", kwargs={"channel": RUN_CHANNEL}, connection=conn, retry=False)


def test_sigterm_mid_campaign_finishes_the_batch_in_flight_starts_none_and_the_next_worker_sends_the_rest(
    tmp_path: Path,
    db: None,
) -> None:
    began = time.monotonic()
    kv, tenant, campaign_id, env, argv = started_campaign(tmp_path)
    producer = Celery("drain-producer", set_as_current=False)
    with FakeProviderServer(delay_s=2.0) as fake, Processes(tmp_path) as procs, use_kv(kv):
        env = {**env, "DRAIN_PROVIDER_URL": fake.base_url}
        try:
            first = procs.start("worker-1", [*argv, "-n", "drain-1@%h"], env)
            wait_until(lambda: "ready." in procs.log("worker-1"), "the first worker", timeout_s=40)
            run_campaign(producer, tmp_path)
            wait_until(lambda: fake.count() >= BATCH, "the first batch to reach the provider", timeout_s=30)
            time.sleep(0.3)  # the batch is out (the provider answers in 2 s)
            at_sigterm = fake.count()
            signalled = time.monotonic()
            os.killpg(first.pid, signal.SIGTERM)  # the whole group, pool child included (systemd's default)
            status = first.wait(timeout=30)
            drain_s = time.monotonic() - signalled
            after_exit = fake.count()
            stopped = deliveries(tenant, campaign_id)

            second = procs.start("worker-2", [*argv, "-n", "drain-2@%h"], env)
            wait_until(lambda: selectors.campaign_get(tenant, campaign_id).state == "completed",
                       "the second worker to send the rest", timeout_s=40)  # fmt: skip
            final = deliveries(tenant, campaign_id)
            os.killpg(second.pid, signal.SIGTERM)
            second_status = second.wait(timeout=30)
        except BaseException:
            print(procs.log("worker-1")[-6000:])
            print(procs.log("worker-2")[-4000:])
            raise
        finally:
            producer.close()
        first_log = procs.log("worker-1")
        per_recipient = {a: fake.count(a) for a in ADDRESSES}
    kv.close()
    fault_report(
        f"FAULT sigterm-mid-campaign: {N} recipients in batches of {BATCH}, provider 2 s; requests at SIGTERM "
        f"{at_sigterm}, after it {after_exit - at_sigterm}; at exit {states(stopped)}, exit status {status} "
        f"after {drain_s:.1f} s; after restart {states(final)}, recipients asked twice "
        f"{sum(c > 1 for c in per_recipient.values())}, second worker exit {second_status}, "
        f"{time.monotonic() - began:.1f} s"
    )
    assert after_exit == at_sigterm == BATCH, "no request leaves after the SIGTERM: no new batch starts"
    assert states(stopped) == {"accepted": BATCH, "pending": N - BATCH}, "the batch in flight is recorded"
    assert status == 0, first_log
    assert "requeued for the next worker" in first_log, first_log
    assert states(final) == {"accepted": N}
    assert all(c == 1 for c in per_recipient.values()), per_recipient
    assert second_status == 0
