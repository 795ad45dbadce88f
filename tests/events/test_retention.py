"""Journal retention: the ``events.prune`` beat task and ``BOTMESH_JOURNAL_RETENTION_DAYS``."""

from __future__ import annotations

import pytest
from django.test import override_settings

from botmesh_admin import config
from botmesh_admin.celery import app as celery_app
from botmesh_admin.events import Envelope, use_journal
from botmesh_admin.events.memory import MemoryEventJournal
from botmesh_admin.events.services import DAY_MS, journal_prune
from botmesh_admin.events.tasks import prune, retention_entries

NOW = 1_700_000_000_000


def journal_with_ages(days_ago: list[int], dead_days_ago: int = 30) -> MemoryEventJournal:
    """Done records finished ``days_ago`` days before NOW, plus one old dead and one pending record."""
    clock = [NOW - 400 * DAY_MS]
    journal = MemoryEventJournal(clock=lambda: clock[0])
    for i, age in enumerate(days_ago):
        journal.append(Envelope(type="t.done", tenant="acme", payload={}, idempotency_key=f"d{i}"))
        r = journal.claim(NOW - age * DAY_MS, 1000)
        journal.ack(r.id, NOW - age * DAY_MS, r.fencing_token)
    journal.append(Envelope(type="t.dead", tenant="acme", payload={}, idempotency_key="dead", channel="x"))
    for attempt in range(journal.policy.max_attempts):
        r = journal.claim(NOW - dead_days_ago * DAY_MS + attempt * 10**7, 1000, channel="x")
        journal.fail(r.id, r.available_at - 1000, r.fencing_token, "boom")
    journal.append(Envelope(type="t.wait", tenant="acme", payload={}, idempotency_key="pending"))
    return journal


def test_prune_keeps_the_last_seven_days_by_default() -> None:
    journal = journal_with_ages([1, 6, 8, 30])
    with use_journal(journal):
        assert journal_prune(now=NOW) == 2
    left = sorted(r.idempotency_key for r in journal.export_records())
    assert left == ["d0", "d1", "dead", "pending"]


@override_settings(BOTMESH_JOURNAL_RETENTION_DAYS=2)
def test_the_retention_setting_moves_the_cutoff() -> None:
    journal = journal_with_ages([1, 3])
    with use_journal(journal):
        assert journal_prune(now=NOW) == 1
    assert {r.idempotency_key for r in journal.export_records()} == {"d0", "dead", "pending"}


@override_settings(BOTMESH_JOURNAL_RETENTION_DAYS=0)
def test_retention_zero_keeps_everything() -> None:
    journal = journal_with_ages([100])
    with use_journal(journal):
        assert journal_prune(now=NOW) == 0
    assert len(journal.export_records()) == 3


def test_prune_works_through_more_records_than_one_batch() -> None:
    journal = journal_with_ages([10] * 2500)
    with use_journal(journal):
        assert journal_prune(now=NOW) == 2500
        assert journal_prune(now=NOW) == 0


def test_dead_letters_are_never_pruned_however_old() -> None:
    journal = journal_with_ages([], dead_days_ago=365)
    with use_journal(journal):
        assert journal_prune(now=NOW + 365 * DAY_MS) == 0
    assert journal.list(state="dead")[0].idempotency_key == "dead"


def test_the_celery_task_prunes_and_beat_runs_it_hourly() -> None:
    journal = journal_with_ages([8])
    with use_journal(journal):
        assert prune.run() == 1  # the wall clock is long after NOW
    assert celery_app.conf.beat_schedule["events.prune"] == retention_entries()["events.prune"]
    assert retention_entries()["events.prune"]["schedule"] == 3600


def test_retention_days_come_from_the_environment() -> None:
    assert config.load({}).journal_retention_days == 7
    assert config.load({"BOTMESH_JOURNAL_RETENTION_DAYS": "30"}).journal_retention_days == 30
    with pytest.raises(config.ConfigError, match="BOTMESH_JOURNAL_RETENTION_DAYS"):
        config.load({"BOTMESH_JOURNAL_RETENTION_DAYS": "a week"})
