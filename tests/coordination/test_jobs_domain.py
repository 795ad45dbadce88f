"""Schedules and the catch-up policy of durable scheduled jobs."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from botmesh_admin.coordination.domain import (
    JobSettings,
    JobSpec,
    JobState,
    Schedule,
    due_occurrences,
    occurrence_id,
)
from botmesh_admin.errors import ValidationError


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def test_interval_occurrences_are_aligned_on_the_epoch() -> None:
    """Every beat computes the same scheduled times, whenever it started."""
    s = Schedule.interval(10)
    assert s.occurrences(ms("2025-01-01T00:00:03"), ms("2025-01-01T00:00:31")) == [
        ms("2025-01-01T00:00:10"),
        ms("2025-01-01T00:00:20"),
        ms("2025-01-01T00:00:30"),
    ]
    assert s.next_after(ms("2025-01-01T00:00:10")) == ms("2025-01-01T00:00:20")
    assert s.describe() == "every 10 s" and Schedule.interval(7200).describe() == "every 2 h"


def test_crontab_follows_celery_semantics_in_utc() -> None:
    """Weekdays 9-17 every 15 minutes: Friday 17:45 is followed by Monday 09:00."""
    s = Schedule.cron("*/15 9-17 * * mon-fri")
    assert s.next_after(ms("2025-01-03T17:45:00")) == ms("2025-01-06T09:00:00")  # Fri -> Mon
    assert s.next_after(ms("2025-01-06T09:00:00")) == ms("2025-01-06T09:15:00")
    assert s.occurrences(ms("2025-01-06T09:00:00"), ms("2025-01-06T10:00:00")) == [
        ms("2025-01-06T09:15:00"),
        ms("2025-01-06T09:30:00"),
        ms("2025-01-06T09:45:00"),
        ms("2025-01-06T10:00:00"),
    ]
    assert Schedule.cron("0 0 29 2 *").next_after(ms("2025-03-01T00:00:00")) == ms("2028-02-29T00:00:00")
    assert Schedule.cron("0 3 * * 0").next_after(ms("2025-01-01T00:00:00")) == ms("2025-01-05T03:00:00")  # Sunday


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: Schedule.interval(0), "schedule.every_s"),
        (lambda: Schedule.interval("5"), "schedule.every_s"),
        (lambda: Schedule.cron("* * *"), "schedule.crontab"),
        (lambda: Schedule.cron("77 * * * *"), "schedule.crontab"),
        (lambda: JobSettings(Schedule.interval(5), catch_up="sometimes"), "job.catch_up"),
        (lambda: JobSettings(Schedule.interval(5), catch_up_window_s=-1), "job.catch_up_window_s"),
        (lambda: JobSpec("Bad Id", "t", JobSettings(Schedule.interval(5))), "job.id"),
        (lambda: JobSpec("ok", "not a task!", JobSettings(Schedule.interval(5))), "job.task"),
    ],
)
def test_bad_schedules_name_the_field(build, field: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError) as info:
        build()
    assert info.value.field == field


def test_settings_round_trip_as_json() -> None:
    settings = JobSettings(
        Schedule.cron("0 3 * * *"),
        enabled=False,
        catch_up="all",
        catch_up_window_s=60,
        resume_after_ms=5,
        updated_by="user:ana",
    )
    assert JobSettings.from_json(settings.to_json()) == settings


def test_occurrence_ids_are_deterministic() -> None:
    assert occurrence_id("kv.sweep", 1735689600000) == "kv.sweep@1735689600000"


NOW = ms("2025-01-01T12:00:00")
EVERY_MIN = Schedule.interval(60)


def _due(policy: str, window_s: int = 3600, down_since: str = "2025-01-01T11:55:30") -> list[int]:
    settings = JobSettings(EVERY_MIN, catch_up=policy, catch_up_window_s=window_s)
    due, considered = due_occurrences(settings, JobState(ms(down_since)), NOW)
    assert considered == NOW
    return due


def test_catch_up_all_runs_every_missed_occurrence() -> None:
    assert _due("all") == [ms(f"2025-01-01T11:5{m}:00") for m in (6, 7, 8, 9)] + [NOW]


def test_catch_up_latest_runs_only_the_newest_missed_one_within_the_window() -> None:
    assert _due("latest") == [ms("2025-01-01T11:59:00"), NOW]
    assert _due("latest", window_s=30) == [NOW]  # 11:59 is 60 s old: outside a 30 s window


def test_catch_up_skip_runs_only_what_is_on_time() -> None:
    assert _due("skip") == [NOW]


def test_a_first_tick_and_a_disabled_job_do_not_backfill() -> None:
    settings = JobSettings(EVERY_MIN, catch_up="all")
    assert due_occurrences(settings, None, NOW) == ([NOW], NOW)  # on time: within the grace
    assert due_occurrences(settings, None, NOW + 10_000) == ([], None)  # nothing due yet
    disabled = JobSettings(EVERY_MIN, enabled=False, catch_up="all")
    assert due_occurrences(disabled, JobState(NOW - 600_000), NOW) == ([], NOW)
    resumed = JobSettings(EVERY_MIN, catch_up="all", resume_after_ms=NOW - 90_000)
    assert due_occurrences(resumed, JobState(NOW - 600_000), NOW)[0] == [NOW - 60_000, NOW]
