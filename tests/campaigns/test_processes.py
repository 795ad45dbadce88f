"""Crash-safety with real processes: SIGKILL mid-broadcast, two senders at once, pause and resume.

Senders are ``tests/campaigns/worker.py`` processes over one SQLite Kv file;
the provider is a ``FakeProviderServer`` in this process that counts the
requests each recipient got. The promise checked every time: nobody gets two
requests, and every planned recipient ends with exactly one outcome —
accepted, failed or dropped with the provider's answer recorded, or
``in_doubt`` when the provider saw the request without its answer being
recorded or never saw it. Nobody is silently skipped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from botmesh_admin.channels.providers import WhatsAppProvider
from botmesh_admin.kv import connect
from botmesh_admin.kv.runtime import use_kv
from campaigns import selectors, services
from campaigns.services.sending import CampaignBot
from crm import selectors as crm_selectors
from crm import services as crm
from crm.stores.kv import KvContactStore
from tests.backends import unique_id
from tests.polling import wait_until

ROOT = Path(__file__).resolve().parents[2]
N = 500
ADDRESSES = [f"+5730{i:08d}" for i in range(N)]


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """A SQLite Kv file with a tenant of 500 contacts who granted WhatsApp consent, and a segment."""
    path = tmp_path_factory.mktemp("campaigns-kv") / "kv.sqlite3"
    url = f"sqlite:///{path}"
    kv = connect(url)
    tenant = unique_id("cp")
    crm_selectors._regions[tenant] = ("CO", float("inf"))
    store = KvContactStore(kv)
    from crm.domain import Consent, Contact, Identity, new_id

    ids = []
    for i, address in enumerate(ADDRESSES):
        ids.append(new_id("c"))
        store.contact_insert(
            tenant,
            Contact(
                id=ids[-1],
                identities=(Identity("whatsapp", address),),
                name=f"Cliente {i}",
                tags=("promo",),
                consent={"whatsapp": Consent("whatsapp", "granted", 1, "test")},
                created_at=1,
                updated_at=1,
            ),
        )
    with use_kv(kv):
        segment = crm.segment_create(tenant, name="Promo", rules={"tags_all": ["promo"]})
    yield url, kv, tenant, segment.id, ids
    kv.close()


@pytest.fixture
def campaign(shared, request, db):
    """A started campaign to the 500 contacts (or the first ``n`` listed, with ``@pytest.mark.parametrize``
    of ``audience``); yields ``(kv url, tenant, campaign id)`` inside ``use_kv``."""
    url, kv, tenant, segment_id, ids = shared
    n = getattr(request, "param", None)
    with use_kv(kv):
        c = services.campaign_create(
            tenant,
            name=unique_id("run"),
            segment_id=segment_id,
            channel="whatsapp",
            message={"template": "promo_nov", "language": "es"},
            contact_ids=ids[:n] if n else None,
        )
        services.campaign_start(tenant, c.id)
        yield url, tenant, c.id


def spawn(url: str, tenant: str, campaign_id: str, base_url: str, **kw) -> subprocess.Popen[str]:
    """Start a worker process; it loads Django and waits for ``go(proc)`` before it sends."""
    args = {
        "kv_url": url,
        "tenant": tenant,
        "campaign_id": campaign_id,
        "base_url": base_url,
        "ttl_ms": 1500,
        "lease_ms": 1500,
        "batch": 25,
        "concurrency": 8,
        "wait_go": True,
        **kw,
    }
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "BOTMESH_KV_URL": url}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.campaigns.worker", json.dumps(args)],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def go(*procs: subprocess.Popen[str]) -> None:
    """Wait until each worker is loaded, then let them all send."""
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().startswith("STARTED")
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()


def finish(proc: subprocess.Popen[str], timeout_s: float = 45) -> str:
    assert proc.stdout is not None
    out = proc.stdout.read()
    proc.wait(timeout=timeout_s)
    assert proc.returncode == 0, out
    return out.strip().splitlines()[-1]


def outcomes(tenant: str, campaign_id: str) -> dict:
    out, after = {}, None
    while True:
        page = selectors.delivery_list(tenant, campaign_id, limit=200, after=after)
        out.update({d.recipient: d for d in page.items})
        if page.next is None:
            return out
        after = page.next


def assert_each_recipient_once(tenant: str, campaign_id: str, fake, n: int = N) -> dict:
    """Check the promise for every planned recipient; return the deliveries."""
    got = outcomes(tenant, campaign_id)
    assert sorted(got) == ADDRESSES[:n], "every planned recipient has a delivery: none skipped"
    for recipient, d in got.items():
        seen = fake.count(recipient)
        assert seen <= 1, f"{recipient} got {seen} requests"
        assert d.state in ("accepted", "failed", "dropped", "in_doubt"), (recipient, d.state)
        if d.state in ("accepted", "failed"):
            assert seen == 1 and d.attempts == 1, "an answer is recorded only for a request the provider saw"
        if d.state == "accepted":
            assert d.provider_message_id and d.sends == 1
        if d.state == "dropped":
            assert seen == 0
        if d.state == "in_doubt":
            assert d.provider_message_id is None and d.error_code is None
    assert_progress_is_the_deliveries(tenant, campaign_id, got)
    return got


def assert_progress_is_the_deliveries(tenant: str, campaign_id: str, got: dict) -> None:
    """After the kills and races: the O(1) progress counters equal the deliveries, and no index drifts."""
    from campaigns.domain import count_deliveries
    from campaigns.stores import default_store
    from campaigns.stores.kv import DELIVERY, KvSlotStore

    assert selectors.campaign_progress(tenant, campaign_id).counts == count_deliveries(got.values())
    _, slots = default_store()
    assert isinstance(slots, KvSlotStore)
    table = slots._table(tenant, campaign_id)
    drift = {i.name: slots.layout.check(table, i.name) for i in DELIVERY.indexes}
    assert {name: r for name, r in drift.items() if any(r.values())} == {}


def test_sigkill_mid_broadcast_then_a_new_worker_sends_nobody_twice_and_skips_nobody(campaign, fake) -> None:
    url, tenant, campaign_id = campaign
    for i in (3, 150, 400):
        fake.script(ADDRESSES[i], "window_closed")
    for i in (7, 333):
        fake.script(ADDRESSES[i], "drop")  # the provider gets it, the answer is lost
    # The batch 200..224 hangs on its first eight requests (eight connections): the kill lands inside a
    # broadcast, with 200..207 seen by the provider and unanswered, and 208..224 never sent.
    for i in range(200, 208):
        fake.script(ADDRESSES[i], "accepted", delay_s=20)
    fake.set_delay(0.002)

    first = spawn(url, tenant, campaign_id, fake.base_url)
    second = spawn(url, tenant, campaign_id, fake.base_url)
    go(first)
    wait_until(
        lambda: all(fake.count(ADDRESSES[i]) for i in range(200, 208)),
        "the hanging batch to reach the provider",
        interval_s=0.01,
    )
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    seen_before = {a for a in ADDRESSES if fake.count(a)}

    go(second)
    assert finish(second) == "DONE completed"

    got = assert_each_recipient_once(tenant, campaign_id, fake)
    doubt = {r for r, d in got.items() if d.state == "in_doubt"}
    hung = set(ADDRESSES[200:225])
    assert hung <= doubt, "the batch in flight at the kill is in doubt: seen-but-unanswered and never-sent alike"
    assert doubt == hung | {ADDRESSES[7], ADDRESSES[333]}
    assert {r for r in hung if fake.count(r)} == set(ADDRESSES[200:208]) <= seen_before
    assert {r for r in hung if not fake.count(r)} == set(ADDRESSES[208:225])
    assert {r for r, d in got.items() if d.state == "failed"} == {ADDRESSES[3], ADDRESSES[150], ADDRESSES[400]}
    assert sum(d.state == "accepted" for d in got.values()) == N - 3 - len(doubt)
    counts = selectors.campaign_progress(tenant, campaign_id).counts
    assert counts.reasons["in_doubt:sender_lost"] == 25 and counts.reasons["in_doubt:no_answer"] == 2
    assert selectors.campaign_get(tenant, campaign_id).state == "completed"

    # A person checks one unanswered recipient and resends it: exactly one more request, to that one only.
    fake.script(ADDRESSES[208], "accepted")
    services.delivery_resend(tenant, campaign_id, recipients=[ADDRESSES[208]])
    provider = WhatsAppProvider(fake.base_url, "106540352242922", "test-token", timeout_s=5)
    assert services.campaign_run(tenant, campaign_id, bot=CampaignBot(provider)).state == "completed"
    assert fake.count(ADDRESSES[208]) == 1 and fake.count() == len(seen_before) + (N - 200 - 25) + 1
    assert outcomes(tenant, campaign_id)[ADDRESSES[208]].state == "accepted"


@pytest.mark.parametrize("campaign", [200], indirect=True)
def test_two_workers_started_at_once_send_nobody_twice(campaign, fake) -> None:
    """Both senders run without the runner lease: the send slots alone keep every recipient to one request."""
    url, tenant, campaign_id = campaign
    fake.set_delay(0.002)
    workers = [spawn(url, tenant, campaign_id, fake.base_url) for _ in range(2)]
    go(*workers)
    results = [finish(w) for w in workers]
    assert results == ["DONE completed"] * 2
    got = assert_each_recipient_once(tenant, campaign_id, fake, n=200)
    assert {d.state for d in got.values()} == {"accepted"}
    assert fake.count() == 200


def test_pause_then_resume_with_real_workers_sends_nobody_twice(campaign, fake) -> None:
    url, tenant, campaign_id = campaign
    fake.set_delay(0.002)
    worker = spawn(url, tenant, campaign_id, fake.base_url)
    later = spawn(url, tenant, campaign_id, fake.base_url)
    go(worker)
    wait_until(lambda: fake.count() >= 100, "100 requests", interval_s=0.01)
    services.campaign_pause(tenant, campaign_id)
    assert finish(worker) == "DONE paused"
    paused_at = fake.count()
    assert paused_at < N
    time.sleep(0.3)
    assert fake.count() == paused_at, "nothing leaves while paused"
    services.campaign_resume(tenant, campaign_id)
    go(later)
    assert finish(later) == "DONE completed"
    got = assert_each_recipient_once(tenant, campaign_id, fake)
    assert {d.state for d in got.values()} == {"accepted"} and fake.count() == N


def test_a_worker_killed_mid_run_is_resumed_by_another_through_the_journal_lease_nobody_twice(
    shared, fake, tmp_path, db
) -> None:
    """The run is a journal event: the second worker cannot take it while the first holds its lease
    (renewed by the heartbeat through a hung broadcast), claims it once the killed first's lease lapsed
    (a higher fencing token, attempt 2), and sends the rest: nobody twice, nobody skipped."""
    from botmesh_admin.events import connect_journal
    from botmesh_admin.events.runtime import use_journal
    from campaigns.domain import RUN_CHANNEL

    url, kv, tenant, segment_id, ids = shared
    n = 200
    journal_url = f"sqlite:///{tmp_path}/journal.sqlite3"
    journal = connect_journal(journal_url)
    try:
        with use_kv(kv), use_journal(journal):
            c = services.campaign_create(
                tenant,
                name=unique_id("journal"),
                segment_id=segment_id,
                channel="whatsapp",
                message={"template": "promo_nov", "language": "es"},
                contact_ids=ids[:n],
            )
            services.campaign_start(tenant, c.id)  # publishes the run event into the workers' journal
        (run,) = journal.list(tenant=tenant, channel=RUN_CHANNEL)
        assert (run.type, run.state, run.payload) == ("campaigns.run", "pending", {"campaign_id": c.id})
        for i in range(100, 108):  # the batch 100..124 hangs on its first eight requests
            fake.script(ADDRESSES[i], "accepted", delay_s=20)
        fake.set_delay(0.002)
        first = spawn(url, tenant, c.id, fake.base_url, journal_url=journal_url)
        second = spawn(url, tenant, c.id, fake.base_url, journal_url=journal_url)
        try:
            go(first)
            wait_until(
                lambda: all(fake.count(ADDRESSES[i]) for i in range(100, 108)), "the hung batch", interval_s=0.01
            )
            held = journal.get(run.id)
            assert held is not None and held.state == "leased" and held.attempts == 1
            go(second)
            time.sleep(3 * 1.5)  # three lease periods: the first's heartbeat keeps the run its own
            assert journal.get(run.id).fencing_token == held.fencing_token, "the second did not take a live lease"
            with use_kv(kv):
                assert selectors.campaign_get(tenant, c.id).state == "running"
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=10)
            assert finish(second) == "DONE completed"
        finally:
            for proc in (first, second):
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=10)
        done = journal.get(run.id)
        assert done is not None and done.state == "done" and done.attempts == 2
        assert done.fencing_token > held.fencing_token, "the second worker's claim fenced the first's"
        with use_kv(kv):
            got = assert_each_recipient_once(tenant, c.id, fake, n=n)
            assert {r for r, d in got.items() if d.state == "in_doubt"} == set(ADDRESSES[100:125])
            assert sum(d.state == "accepted" for d in got.values()) == n - 25
            assert selectors.campaign_get(tenant, c.id).state == "completed"
    finally:
        journal.close()
