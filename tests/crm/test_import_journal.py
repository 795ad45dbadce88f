"""CSV imports run as journal events (``crm.import`` on channel ``crm-import``, issue 14 item 3).

They inherit the journal's fenced lease and heartbeat (a SIGKILLed worker's
import is resumed by another worker once its lease lapses, after the last saved
row), its retries and its dead-letter queue (an import that keeps failing ends
``dead`` in the journal and ``failed`` on the import's page).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from pathlib import Path

import pytest

from botmesh_admin.clock import FakeClock, use_clock
from botmesh_admin.events import RetryPolicy, connect_journal, use_journal
from botmesh_admin.events.handlers import dispatch
from botmesh_admin.events.worker import EventWorker
from botmesh_admin.kv import connect
from crm import selectors, services
from crm.domain import ImportJob, new_id
from crm.services.imports import IMPORT_CHANNEL, PROGRESS_EVERY_ROWS
from crm.stores import default_store, use_store
from crm.stores.kv import KvContactStore
from tests.backends import unique_id
from tests.polling import wait_until

from . import workers

ROWS = 600


def _csv(rows: int) -> str:
    return "name,phone,tags\n" + "".join(f"Persona {n},+57300{n:07d},lote\n" for n in range(rows))


@pytest.fixture
def sqlite_crm(tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """A tenant over a Kv and a journal in SQLite files another process opens too: ``(tenant, kv_url, journal_url)``."""
    tenant = unique_id("imp")
    kv_url, journal_url = f"sqlite:///{tmp_path}/kv.sqlite3", f"sqlite:///{tmp_path}/journal.sqlite3"
    kv, journal = connect(kv_url), connect_journal(journal_url)
    selectors._regions[tenant] = ("CO", float("inf"))
    try:
        with use_store(KvContactStore(kv)), use_journal(journal):
            yield tenant, kv_url, journal_url
    finally:
        selectors.tenant_region_forget(tenant)
        journal.close()
        kv.close()


def test_an_import_whose_worker_is_killed_is_resumed_by_another_worker_through_the_journal_lease(
    sqlite_crm: tuple[str, str, str], db: None
) -> None:
    tenant, kv_url, journal_url = sqlite_crm
    job = services.contact_import_start(tenant, filename="lote.csv", data=_csv(ROWS))
    event = services.contact_import_queue(tenant, job.id)
    assert event.channel == IMPORT_CHANNEL and event.state == "pending"
    ctx = multiprocessing.get_context("spawn")
    first = ctx.Process(target=workers.import_worker, args=(kv_url, journal_url, tenant, 1000), daemon=True)
    first.start()
    try:
        wait_until(
            lambda: selectors.import_job_get(tenant, job.id).processed >= PROGRESS_EVERY_ROWS,
            "the first worker to save progress",
            timeout_s=60,
            interval_s=0.01,
        )
        first.kill()  # SIGKILL mid-import: no handler code runs, the lease is left to lapse
        first.join(timeout=10)
    finally:
        if first.is_alive():
            first.kill()
            first.join(timeout=10)
    killed = selectors.import_job_get(tenant, job.id)
    assert killed.status == "running" and 0 < killed.processed < ROWS, "killed mid-import"
    assert killed.event_id == event.id

    journal = connect_journal(journal_url)
    try:
        held = journal.get(event.id)
        assert held is not None and held.state == "leased" and held.attempts == 1
        second = EventWorker(journal, lease_ms=5000, channel=IMPORT_CHANNEL)
        wait_until(
            lambda: second.run_batch(dispatch, 1)["processed"] == 1,
            "the second worker to claim the import once the first one's lease lapsed",
            timeout_s=30,
            interval_s=0.1,
        )
        record = journal.get(event.id)
    finally:
        journal.close()
    assert record is not None and record.state == "done"
    assert record.attempts == 2 and record.fencing_token > held.fencing_token
    done = selectors.import_job_get(tenant, job.id)
    assert (done.status, done.processed, done.created + done.merged, done.failed_rows) == ("done", ROWS, ROWS, 0)
    # Resumed after the last saved row: only the rows the killed worker did after it are merged again.
    assert done.merged <= PROGRESS_EVERY_ROWS
    assert len(list(selectors.contact_iter(tenant))) == ROWS, "every row is one contact, none twice"


def test_an_import_that_keeps_failing_is_retried_then_dead_lettered_and_shown_failed(memory_crm: str, db: None) -> None:
    clock = FakeClock(1_800_000_000_000)
    policy = RetryPolicy(max_attempts=3, base_delay_ms=1000, max_delay_ms=1000, jitter=0.0)
    # The stored upload is unreadable (no header row): every run of it stops.
    job = default_store().import_job_insert(
        memory_crm, ImportJob(id=new_id("imp"), status="queued", filename="roto.csv", total_rows=1), ""
    )
    with use_clock(clock), use_journal(connect_journal("memory://", policy=policy, clock=clock)) as journal:
        event = services.contact_import_queue(memory_crm, job.id)
        worker = EventWorker(journal, lease_ms=5000, clock=clock, channel=IMPORT_CHANNEL)
        for attempt in (1, 2):
            assert worker.run_batch(dispatch, 1) == {"processed": 0, "failed": 1, "stale": 0}
            retrying = selectors.import_job_get(memory_crm, job.id)
            assert retrying.status == "running" and "it is retried" in (retrying.message or "")
            pending = journal.get(event.id)
            assert pending is not None and pending.state == "pending", f"attempt {attempt} has a retry left"
            assert worker.run_batch(dispatch, 1)["failed"] == 0, "not before its backoff"
            clock.advance(1000)
        assert worker.run_batch(dispatch, 1) == {"processed": 0, "failed": 1, "stale": 0}
        dead = journal.get(event.id)
    assert dead is not None and dead.state == "dead" and dead.attempts == 3
    assert "ValidationError" in (dead.last_error or "")
    failed = selectors.import_job_get(memory_crm, job.id)
    assert failed.status == "failed" and failed.message == "the import stopped: ValidationError"
