"""A campaign whose ``campaigns.run`` event the journal dead-letters is ``failed`` with the reason, not ``running``.

Regression (session 7 review): a run whose last attempt failed, or whose
worker died on it, left the campaign "running" with nobody sending it. The
real worker (``journal_drain``) over a SQLite and a PostgreSQL journal calls
the type's dead-letter hook: the campaign is ``failed``, its error (page and
API) says why, and Resume sends the rest.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.test import Client

from botmesh_admin.clock import FakeClock, use_clock
from botmesh_admin.events import RetryPolicy, connect_journal, use_journal
from botmesh_admin.events.services import journal_drain
from botmesh_admin.tenancy import services as tenancy
from campaigns import selectors, services
from campaigns.domain import RUN_CHANNEL
from tests.events.sqljournals import SQL_BACKENDS, sql_journal_url

from .test_scheduling import _started

LEASE_MS = 5_000


@pytest.mark.parametrize("backend", SQL_BACKENDS)
def test_a_run_dead_lettered_at_claim_after_its_worker_died_leaves_the_campaign_failed_with_the_reason(
    world: str, backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    tenancy.tenant_create(world, name="Dead letters")
    token = tenancy.token_create(world, name="ci")[1]
    clock = FakeClock(1_800_000_000_000)
    journal = connect_journal(
        sql_journal_url(backend, request, tmp_path), policy=RetryPolicy(max_attempts=1, jitter=0.0), clock=clock
    )
    try:
        with use_clock(clock), use_journal(journal):
            campaign = _started(world)
            # A worker claims the run's last attempt and dies (SIGKILL): nothing settles it.
            [held] = journal.claim_many(clock(), LEASE_MS, RUN_CHANNEL, 1)
            assert held.payload == {"campaign_id": campaign.id}
            clock.advance(LEASE_MS + 1)
            assert journal_drain(channel=RUN_CHANNEL) == {"processed": 0, "failed": 0, "stale": 0}
            assert journal.get(held.id).state == "dead"
            response = Client().get(
                f"/api/v1/tenants/{world}/campaigns/{campaign.id}", HTTP_AUTHORIZATION=f"Bearer {token}"
            )
            assert response.status_code == 200, response.content
            body = json.loads(response.content)
            assert body["state"] == "failed"
            assert "lease expired on attempt 1" in body["error"] and "resume" in body["error"]
            # Resume publishes a new run: the campaign goes on.
            assert services.campaign_resume(world, campaign.id).state == "running"
            assert selectors.campaign_get(world, campaign.id).error is None
    finally:
        journal.close()
