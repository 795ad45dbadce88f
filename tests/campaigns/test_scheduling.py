"""The ``campaigns.tick`` durable job: scheduled campaigns start at their time, stalled ones are sent again."""

from __future__ import annotations

from dataclasses import replace

from botmesh_admin.coordination.registry import declared_jobs
from botmesh_admin.events import connect_journal
from botmesh_admin.events.base import RetryPolicy
from botmesh_admin.events.runtime import use_journal
from campaigns import selectors, services
from campaigns.domain import RUN_CHANNEL, now_ms
from campaigns.stores import default_store
from crm import services as crm

from .conftest import make_contacts


def _started(tenant: str, **kw):
    make_contacts(tenant, 2)
    segment = crm.segment_create(tenant, name="Promo", rules={"tags_all": ["promo"]})
    c = services.campaign_create(
        tenant, name="x", segment_id=segment.id, channel="whatsapp", message={"template": "promo_nov"}
    )
    return services.campaign_start(tenant, c.id, **kw)


def test_the_tick_is_a_declared_durable_job() -> None:
    (job,) = [j for j in declared_jobs() if j.id == "campaigns.tick"]
    assert (job.task, job.durable) == ("campaigns.tick", True)
    assert job.defaults.schedule.every_s == 10


def test_a_due_campaign_starts_once_however_often_the_tick_runs(world: str) -> None:
    at = now_ms() + 60_000
    campaign = _started(world, scheduled_at=at)
    dispatched: list[tuple[str, str]] = []
    assert services.campaigns_tick(at_ms=at - 1, dispatch=lambda t, c: dispatched.append((t, c)))["started"] == 0
    # Two beats and a redelivered occurrence at the same moment: the campaign starts once.
    started = [
        services.campaigns_tick(at_ms=at, dispatch=lambda t, c: dispatched.append((t, c)))["started"] for _ in range(3)
    ]
    assert started == [1, 0, 0]
    assert dispatched[0] == (world, campaign.id)
    assert selectors.campaign_get(world, campaign.id).state == "running"


def test_a_running_campaign_nobody_sends_is_dispatched_again(world: str) -> None:
    with use_journal(connect_journal("memory://")) as journal:
        campaign = _started(world)
        seen: list[str] = []
        services.campaigns_tick(at_ms=now_ms(), dispatch=lambda t, c: seen.append(c))
        assert seen == [], "just started: its task is probably on its way"
        later = now_ms() + 10_000
        run = journal.claim(later, 60_000, RUN_CHANNEL)  # a worker holds the campaign's run event
        assert run is not None and run.payload == {"campaign_id": campaign.id}
        services.campaigns_tick(at_ms=later, dispatch=lambda t, c: seen.append(c))
        assert seen == [], "a live runner holds it"
        journal.ack(run.id, later, run.fencing_token)
        assert services.campaigns_tick(at_ms=later, dispatch=lambda t, c: seen.append(c))["redispatched"] == 1
        assert seen == [campaign.id]


def test_the_tick_publishes_a_run_and_leaves_a_dead_lettered_one_to_a_person(world: str) -> None:
    """The tick's re-dispatch is a new run event; a run the journal dead-lettered is not retried behind its back."""
    with use_journal(connect_journal("memory://", policy=RetryPolicy(max_attempts=1))) as journal:
        campaign = _started(world)
        later = now_ms() + 10_000
        first = journal.claim(later, 60_000, RUN_CHANNEL)
        assert first is not None
        journal.ack(first.id, later, first.fencing_token)
        assert services.campaigns_tick(at_ms=later)["redispatched"] == 1
        assert services.campaigns_tick(at_ms=later)["redispatched"] == 0, "its new run event is pending"
        second = journal.claim(later, 60_000, RUN_CHANNEL)
        assert second is not None and second.payload == {"campaign_id": campaign.id} and second.id != first.id
        assert journal.fail(second.id, later, second.fencing_token, "boom").state == "dead"
        assert services.campaigns_tick(at_ms=later + 60_000)["redispatched"] == 0
        journal.replay(second.id)
        assert journal.claim(later + 60_000, 60_000, RUN_CHANNEL).id == second.id


def test_the_tick_forgets_campaigns_that_ended(world: str) -> None:
    campaign = _started(world)
    campaigns, _ = default_store()
    current = campaigns.campaign_get(world, campaign.id)
    campaigns.campaign_replace(world, replace(current, state="completed"), expected_version=current.version)
    counts = services.campaigns_tick(at_ms=now_ms(), dispatch=lambda t, c: None)
    assert counts["cleaned"] == 1
    assert not [e for e in campaigns.index_scan() if e.tenant == world]
