"""The scheduler leader's tick, the occurrence ledger and LeaderScheduler, in one process."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from botmesh_admin.clock import FakeClock, use_clock
from botmesh_admin.coordination import StaleFence, services
from botmesh_admin.coordination.beat import FileElector, LeaderScheduler
from botmesh_admin.coordination.domain import JobSettings, JobSpec, JobState, Schedule
from botmesh_admin.coordination.memory import MemoryCoordinationHub, MemoryCoordinator
from botmesh_admin.coordination.stores.memory import MemoryJobStore
from botmesh_admin.events import connect_journal
from botmesh_admin.kv.memory import MemoryKv
from botmesh_admin.kv.runtime import use_kv

from . import jobtasks

T0 = 1_735_732_800_000  # 2025-01-01T12:00:00Z


def spec(job_id: str = "count", every_s: int = 10, catch_up: str = "all", **kw) -> JobSpec:  # type: ignore[no-untyped-def]
    return JobSpec(
        job_id,
        "tests.coordination.count_run",
        JobSettings(Schedule.interval(every_s), catch_up=catch_up),
        pass_occurrence=True,
        lease_s=kw.pop("lease_s", 5),
        **kw,
    )


class Sent(list):
    def __call__(self, task: str, kwargs: dict, options: dict) -> None:
        self.append((task, kwargs))


@pytest.fixture
def hub() -> MemoryCoordinationHub:
    return MemoryCoordinationHub()


@pytest.fixture
def journal():  # type: ignore[no-untyped-def]
    j = connect_journal("memory://")
    yield j
    j.close()


@pytest.fixture(autouse=True)
def _clear_runs() -> None:
    jobtasks.RUNS.clear()


def occurrences(journal) -> list[str]:  # type: ignore[no-untyped-def]
    return sorted(r.idempotency_key for r in journal.list(tenant="system", limit=200))


def test_two_racing_leaders_record_each_occurrence_once(hub, journal) -> None:  # type: ignore[no-untyped-def]
    """A deposed leader that still ticks records nothing twice, and its state write is refused."""
    with use_clock(FakeClock(T0)) as clock:  # the lease runs out on the fake clock, not by sleeping
        a, b = (
            MemoryCoordinator(hub, "beat-a", lease_ms=5000),
            MemoryCoordinator(hub, "beat-b", lease_ms=5000),
        )
        store, sent_a, sent_b = MemoryJobStore(), Sent(), Sent()
        lead_a = a.try_lead("scheduler")
        services.scheduler_tick(specs=[spec()], lease=lead_a, send=sent_a, at_ms=T0, store=store, journal=journal)
        a._stop.set()  # beat-a freezes: no renewals; beat-b takes over after the lease
        assert b.try_lead("scheduler") is None
        clock.advance(5000)
        lead_b = b.try_lead("scheduler")
        assert lead_b is not None
        services.scheduler_tick(
            specs=[spec()], lease=lead_b, send=sent_b, at_ms=T0 + 10_000, store=store, journal=journal
        )
        # beat-a wakes up believing it still leads, with its old view of the state (none).
        still_valid = type("Paused", (), {"fence": lead_a.fence, "valid": lambda self: True})()
        with pytest.raises(StaleFence):
            services.scheduler_tick(
                specs=[spec(catch_up="all")],
                lease=still_valid,
                send=sent_a,
                at_ms=T0 + 10_000,
                store=_same_fences(store),
                journal=journal,
            )
        assert occurrences(journal) == [f"count@{T0}", f"count@{T0 + 10_000}"]
        assert sent_a == [("jobs.run", {"channel": "jobs-5s"})]  # the refused tick sent nothing
        assert sent_b == [("jobs.run", {"channel": "jobs-5s"})]
        a.close(release=False)
        b.close()


def _same_fences(store: MemoryJobStore) -> MemoryJobStore:
    """A store that has the same fence mark but none of the state (an outdated view)."""
    view = MemoryJobStore()
    view._fence = store._fence
    return view


def test_catch_up_policies_after_downtime(hub, journal) -> None:  # type: ignore[no-untyped-def]
    """Down for 60 s with a 10 s job: all -> 7 occurrences, latest -> 2, skip -> 1."""
    coordinator = MemoryCoordinator(hub, "beat", lease_ms=5000)
    store = MemoryJobStore()
    specs = [
        spec("all", catch_up="all"),
        spec("latest", catch_up="latest"),
        spec("skip", catch_up="skip"),
    ]
    store.state_put({s.id: JobState(T0 - 60_000) for s in specs}, fence=0)
    lease = coordinator.try_lead("scheduler")
    emitted = services.scheduler_tick(specs=specs, lease=lease, send=Sent(), at_ms=T0, store=store, journal=journal)
    counts = {s.id: sum(1 for e in emitted if e.job_id == s.id) for s in specs}
    assert counts == {"all": 6, "latest": 2, "skip": 1}
    assert store.state_get("skip") == JobState(T0, T0)
    # the next tick within the same second emits nothing more
    assert (
        services.scheduler_tick(specs=specs, lease=lease, send=Sent(), at_ms=T0 + 500, store=store, journal=journal)
        == []
    )
    coordinator.close()


def test_an_occurrence_runs_once_even_when_the_message_is_redelivered(hub, journal) -> None:  # type: ignore[no-untyped-def]
    """Two jobs.run messages for one occurrence: the task runs once, the ledger says done."""
    coordinator = MemoryCoordinator(hub, "beat", lease_ms=5000)
    lease = coordinator.try_lead("scheduler")
    services.scheduler_tick(specs=[spec()], lease=lease, send=Sent(), at_ms=T0, store=MemoryJobStore(), journal=journal)
    assert services.jobs_drain("jobs-5s", journal=journal)["processed"] == 1
    assert services.jobs_drain("jobs-5s", journal=journal)["processed"] == 0
    assert [r["id"] for r in jobtasks.RUNS] == [f"count@{T0}"]
    (record,) = journal.list(tenant="system")
    assert record.state == "done" and record.attempts == 1
    coordinator.close()


def test_a_run_whose_worker_died_is_retried_not_duplicated(hub, journal) -> None:  # type: ignore[no-untyped-def]
    """A claim whose worker vanished is claimed again after its lease and completed once."""
    with use_clock(FakeClock(T0)) as clock:
        coordinator = MemoryCoordinator(hub, "beat", lease_ms=5000)
        lease = coordinator.try_lead("scheduler")
        services.scheduler_tick(
            specs=[spec(lease_s=1)],
            lease=lease,
            send=Sent(),
            at_ms=T0,
            store=MemoryJobStore(),
            journal=journal,
        )
        dead = journal.claim(services.now_ms(), 1000, "jobs-1s")  # a worker claims it, then dies
        assert dead is not None
        assert services.jobs_drain("jobs-1s", journal=journal)["processed"] == 0  # still leased
        clock.advance(1050)  # past the claim's 1 s lease
        assert services.jobs_drain("jobs-1s", journal=journal)["processed"] == 1
        assert len(jobtasks.RUNS) == 1 and jobtasks.RUNS[0]["attempt"] == 2
        assert jobtasks.RUNS[0]["fencing_token"] > dead.fencing_token
        coordinator.close()


def test_a_failing_job_is_recorded_with_its_error(hub, journal) -> None:  # type: ignore[no-untyped-def]
    coordinator = MemoryCoordinator(hub, "beat", lease_ms=5000)
    lease = coordinator.try_lead("scheduler")
    failing = JobSpec(
        "boom",
        "tests.coordination.count_run",
        JobSettings(Schedule.interval(10)),
        kwargs={"fail": True},
        pass_occurrence=True,
        lease_s=5,
    )
    services.scheduler_tick(
        specs=[failing], lease=lease, send=Sent(), at_ms=T0, store=MemoryJobStore(), journal=journal
    )
    assert services.jobs_drain("jobs-5s", journal=journal)["failed"] == 1
    (record,) = journal.list(tenant="system")
    assert record.state == "pending" and "failed on purpose" in (record.last_error or "")
    coordinator.close()


def test_only_the_leading_beat_emits_and_a_follower_takes_over(hub) -> None:  # type: ignore[no-untyped-def]
    """Two LeaderScheduler instances: one sends; after it stops, the other leads and sends."""
    from botmesh_admin.celery import app

    kv = MemoryKv("memory://")
    journal = connect_journal("memory://")
    beats = []
    for name in ("beat-1", "beat-2"):
        beat = LeaderScheduler(app, lazy=True)
        coordinator = MemoryCoordinator(hub, name, lease_ms=5000, role="beat")
        beat._elector = type(
            "E",
            (),
            {
                "lead": lambda self, c=coordinator: c.try_lead("scheduler"),
                "close": lambda self, c=coordinator: c.close(),
            },
        )()
        beat._specs, beat._specs_at = [spec(every_s=1)], time.monotonic()
        beat.sent = Sent()
        beat._send = beat.sent
        beats.append(beat)
    from botmesh_admin.events import use_journal

    with use_kv(kv), use_journal(journal):
        beats[0].tick()
        beats[1].tick()
        assert beats[0].sent and not beats[1].sent
        beats[0].close()
        time.sleep(1.0)
        beats[1].tick()
        assert ("jobs.run", {"channel": "jobs-5s"}) in beats[1].sent
        beats[1].close()
    keys = occurrences(journal)
    assert len(keys) == len(set(keys)) >= 2


def test_file_elector_lets_one_beat_lead_with_growing_fences(tmp_path: Path) -> None:
    """Without Redis: an exclusive file lock; the fence comes from a durable counter."""
    kv = MemoryKv("memory://")
    with use_kv(kv):
        one, two = (
            FileElector(tmp_path / "scheduler.lock"),
            FileElector(tmp_path / "scheduler.lock"),
        )
        first = one.lead()
        assert first is not None and first.valid() and two.lead() is None
        one.close()
        assert not first.valid()
        second = two.lead()
        assert second is not None and second.fence > first.fence
        two.close()
