"""An import whose ``crm.import`` event the journal dead-letters shows ``failed`` with the reason, not ``running``.

Regression (session 7 review): a worker that died on the import's last attempt
left its lease to lapse; the next claim dead-lettered the event and the import
said "running" forever on its page and in the API. The real worker
(``journal_drain``) over a SQLite and a PostgreSQL journal calls the type's
dead-letter hook, which marks the import failed.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from django.test import Client

from botmesh_admin.clock import FakeClock, use_clock
from botmesh_admin.events import RetryPolicy, connect_journal, use_journal
from botmesh_admin.events.services import journal_drain
from botmesh_admin.tenancy import services as tenancy
from crm import selectors, services
from crm.services.imports import IMPORT_CHANNEL
from crm.stores import default_store, use_store
from crm.stores.memory import MemoryContactStore
from tests.backends import unique_id
from tests.events.sqljournals import SQL_BACKENDS, sql_journal_url

LEASE_MS = 5_000


@pytest.mark.parametrize("backend", SQL_BACKENDS)
def test_an_import_dead_lettered_at_claim_after_its_worker_died_shows_failed_with_the_reason(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, db: None
) -> None:
    tenant = unique_id("dlq")
    tenancy.tenant_create(tenant, name="Dead letters")
    token = tenancy.token_create(tenant, name="ci")[1]
    selectors._regions[tenant] = ("CO", float("inf"))
    clock = FakeClock(1_800_000_000_000)
    journal = connect_journal(
        sql_journal_url(backend, request, tmp_path), policy=RetryPolicy(max_attempts=1, jitter=0.0), clock=clock
    )
    try:
        with use_clock(clock), use_journal(journal), use_store(MemoryContactStore()):
            job = services.contact_import_start(tenant, filename="lote.csv", data="name,phone\nAna,+573001112233\n")
            event = services.contact_import_queue(tenant, job.id)
            # A worker claims its last attempt, starts the import, and dies (SIGKILL): nothing settles it.
            [held] = journal.claim_many(clock(), LEASE_MS, IMPORT_CHANNEL, 1)
            store = default_store()
            store.import_job_replace(
                tenant, replace(job, status="running", event_id=held.id), expected_version=job.version
            )
            clock.advance(LEASE_MS + 1)
            assert journal_drain(channel=IMPORT_CHANNEL) == {"processed": 0, "failed": 0, "stale": 0}
            dead = journal.get(event.id)
            assert dead is not None and dead.state == "dead"
            response = Client().get(
                f"/api/v1/tenants/{tenant}/contacts/imports/{job.id}", HTTP_AUTHORIZATION=f"Bearer {token}"
            )
    finally:
        journal.close()
        selectors.tenant_region_forget(tenant)
    assert response.status_code == 200, response.content
    body = json.loads(response.content)
    assert body["status"] == "failed"
    assert "lease expired on attempt 1" in body["message"] and "replay" in body["message"]
