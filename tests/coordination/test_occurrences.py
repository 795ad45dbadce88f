"""The job API of an occurrence run: fenced commits, ``still_holds()``, superseded runs (ARCHITECTURE §9).

Issue 17, item 2: a worker frozen past the job lease resumed and ran the
occurrence to its end after another worker had re-run it; only its ack was
refused. Here each timing of that race is played in one process, on every Kv
backend, against a real journal: the effects land once and the late run is
refused and recorded as superseded. ``test_frozen_job_holder.py`` plays it
with real worker processes and SIGSTOP.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from botmesh_admin.coordination import selectors, services
from botmesh_admin.coordination.domain import JobSettings, JobSpec, Schedule
from botmesh_admin.coordination.memory import MemoryCoordinationHub, MemoryCoordinator
from botmesh_admin.coordination.occurrences import (
    GUARD_PREFIX,
    OccurrenceContext,
    Superseded,
    current_occurrence,
    running,
    superseded_get_many,
)
from botmesh_admin.coordination.stores.kv import KvJobStore
from botmesh_admin.events import EventJournal, EventRecord, connect_journal
from botmesh_admin.kv import ABSENT, Add, DurableKv, Put
from botmesh_admin.kv.indexes import CountIndex, IndexedTable, RecordChange, RecordType
from botmesh_admin.kv.memory import MemoryKv
from botmesh_admin.kv.runtime import use_kv
from tests.backends import KV_BACKENDS, open_kv, unique_id
from tests.polling import wait_until

from . import jobtasks

T0 = 1_735_732_800_000  # 2025-01-01T12:00:00Z


@pytest.fixture(params=KV_BACKENDS)
def kv(request: pytest.FixtureRequest) -> DurableKv:
    return open_kv(request.param, request)


@pytest.fixture
def journal() -> Iterator[EventJournal]:
    j = connect_journal("memory://")
    yield j
    j.close()


@pytest.fixture
def table() -> str:
    return f"coordination/{unique_id('fx')}/effects"


@pytest.fixture(autouse=True)
def _clear_runs() -> Iterator[None]:
    jobtasks.RUNS.clear()
    yield
    jobtasks.RUNS.clear()


def emit(journal: EventJournal, task: str = "tests.coordination.fenced_count", **kwargs: Any) -> JobSpec:
    """Record one occurrence of a fresh job (``<job>@T0``) in the ledger, as the scheduler leader does."""
    spec = JobSpec(unique_id("job"), task, JobSettings(Schedule.interval(10)), kwargs=kwargs, lease_s=1,
                   pass_occurrence=task == "tests.coordination.count_run")  # fmt: skip
    leader = MemoryCoordinator(MemoryCoordinationHub(), "beat", lease_ms=5000)
    lease = leader.try_lead("scheduler")
    assert lease is not None
    services.scheduler_tick(specs=[spec], lease=lease, send=lambda *a: None, at_ms=T0,
                            store=KvJobStore(MemoryKv("memory://")), journal=journal)  # fmt: skip
    leader.close()
    return spec


def claim(journal: EventJournal, spec: JobSpec, lease_ms: int) -> EventRecord:
    record = journal.claim(services.now_ms(), lease_ms, services.jobs_channel(spec))
    assert record is not None
    return record


def taken_over(journal: EventJournal, spec: JobSpec) -> tuple[EventRecord, EventRecord]:
    """Return ``(first, second)``: a claim whose worker froze past its 100 ms lease, and the next worker's."""
    first = claim(journal, spec, 100)
    wait_until(lambda: services.now_ms() > (first.leased_until or 0), "the first lease to expire", 5)
    return first, claim(journal, spec, 5000)


def run(
    record: EventRecord, journal: EventJournal, kv: DurableKv, cls: type[OccurrenceContext] = OccurrenceContext
) -> OccurrenceContext:
    occurrence = cls.from_record(record, journal=journal, kv=kv)
    occurrence.worker = f"worker-token-{record.fencing_token}"
    return occurrence


class FrozenAfterItsCheck(OccurrenceContext):
    """A run whose ledger check passed just before it froze: the commit lands after the next claim."""

    def still_holds(self) -> bool:
        return True


def applied(kv: DurableKv, table: str) -> int:
    entry = kv.get(table, "applied")
    return int(entry.value) if entry is not None else 0


def test_a_fenced_commit_applies_each_step_once_and_names_are_checked(
    kv: DurableKv, journal: EventJournal, table: str
) -> None:
    spec = emit(journal)
    occurrence = run(claim(journal, spec, 5000), journal, kv)
    assert occurrence.still_holds()
    assert occurrence.commit(table, [Add("applied", 1)]) is True
    assert occurrence.commit(table, [Add("applied", 10)], step="second batch") is True
    with pytest.raises(ValueError, match="already committed"):
        occurrence.commit(table, [Add("applied", 100)])  # a loop must name its steps
    assert applied(kv, table) == 11
    guard = kv.get(table, f"{GUARD_PREFIX}{spec.id}@{T0}")
    assert guard is not None and guard.value["token"] == occurrence.fencing_token and guard.expires_at is not None


def test_a_run_that_lost_its_lease_is_refused_and_recorded_as_superseded(
    kv: DurableKv, journal: EventJournal, table: str
) -> None:
    """The frozen holder resumes after the next run committed: its commit is refused, nothing applied."""
    spec = emit(journal)
    first, second = taken_over(journal, spec)
    late, current = run(first, journal, kv), run(second, journal, kv)
    assert current.commit(table, [Add("applied", 1)]) is True
    assert not late.still_holds()
    with pytest.raises(Superseded) as refused:
        late.commit(table, [Add("applied", 1)])
    assert refused.value.by_token == second.fencing_token and refused.value.status == 409
    assert applied(kv, table) == 1
    occurrence = f"{spec.id}@{T0}"
    (superseded,) = superseded_get_many(kv, [occurrence])[occurrence]
    assert superseded.worker == f"worker-token-{first.fencing_token}"
    assert superseded.fencing_token == first.fencing_token and superseded.by_token == second.fencing_token
    assert superseded.attempt == 1 and "taken over" in superseded.reason


def test_a_run_whose_lease_expired_is_refused_before_anyone_took_over(
    kv: DurableKv, journal: EventJournal, table: str
) -> None:
    spec = emit(journal)
    first = claim(journal, spec, 100)
    wait_until(lambda: services.now_ms() > (first.leased_until or 0), "the lease to expire", 5)
    late = run(first, journal, kv)
    with pytest.raises(Superseded) as refused:
        late.commit(table, [Add("applied", 1)])
    assert refused.value.by_token is None and applied(kv, table) == 0
    occurrence = f"{spec.id}@{T0}"
    assert "lease expired" in superseded_get_many(kv, [occurrence])[occurrence][0].reason


def test_a_holder_frozen_after_its_check_is_refused_by_the_tables_guard(
    kv: DurableKv, journal: EventJournal, table: str
) -> None:
    """Its ledger check passed, then it froze; the next run committed: the guard in the table refuses it."""
    spec = emit(journal)
    first, second = taken_over(journal, spec)
    late, current = run(first, journal, kv, FrozenAfterItsCheck), run(second, journal, kv)
    assert current.commit(table, [Add("applied", 1)]) is True
    with pytest.raises(Superseded, match=f"fencing token {second.fencing_token} already committed"):
        late.commit(table, [Add("applied", 1)], step="another step")
    assert applied(kv, table) == 1


def test_a_holder_frozen_after_its_check_that_commits_first_leaves_the_step_done(
    kv: DurableKv, journal: EventJournal, table: str
) -> None:
    """Its commit lands just after the next claim, before the next run's: that run applies nothing again."""
    spec = emit(journal)
    first, second = taken_over(journal, spec)
    late, current = run(first, journal, kv, FrozenAfterItsCheck), run(second, journal, kv)
    assert late.commit(table, [Add("applied", 1)]) is True
    assert current.commit(table, [Add("applied", 1)]) is False  # done once already
    assert current.commit(table, [Add("applied", 5)], step="next") is True
    with pytest.raises(Superseded):  # and the late run is shut out of the table from then on
        late.commit(table, [Add("applied", 1)], step="late step")
    assert applied(kv, table) == 6


def test_a_fenced_commit_keeps_its_own_expectations_and_index_upkeep(
    kv: DurableKv, journal: EventJournal, table: str
) -> None:
    from botmesh_admin.kv import ConflictError

    spec = emit(journal)
    occurrence = run(claim(journal, spec, 5000), journal, kv)
    kv.commit(table, [Put("taken", 1)])
    with pytest.raises(ConflictError) as conflict:
        occurrence.commit(table, [Put("taken", 2, expect=ABSENT)])
    assert conflict.value.key == "taken"
    record = RecordType("item", "i/", (CountIndex("by_kind", ("kind",)),))
    indexed = IndexedTable(kv, (record,))
    change = RecordChange(record, "i/1", None, {"kind": "a"})
    assert occurrence.commit(table, [Put("i/1", {"kind": "a"}, expect=ABSENT)], changes=[change], indexed=indexed)
    assert indexed.count(table, "by_kind", [("a",)]) == [1]


def test_a_run_killed_after_its_commit_is_retried_without_applying_again(
    kv: DurableKv, journal: EventJournal, table: str
) -> None:
    """The worker committed, then died before its ack: the retry runs the task, the effect stays once."""
    spec = emit(journal, table=table)
    dead = run(claim(journal, spec, 300), journal, kv)
    assert dead.commit(table, [Add("applied", 1)]) is True
    wait_until(lambda: _expired(journal, dead), "the lease to expire", 5)
    with use_kv(kv):
        assert services.jobs_drain(services.jobs_channel(spec), journal=journal)["processed"] == 1
    assert [r["attempt"] for r in jobtasks.RUNS] == [2] and applied(kv, table) == 1
    (record,) = [r for r in journal.list(tenant="system") if r.payload["job"] == spec.id]
    assert record.state == "done" and record.attempts == 2


def _expired(journal: EventJournal, occurrence: OccurrenceContext) -> bool:
    record = journal.get(occurrence.event_id)
    return record.leased_until is not None and record.leased_until < services.now_ms()


def test_the_runner_records_a_run_that_finished_after_losing_its_occurrence(journal: EventJournal) -> None:
    """A task without fenced effects: the runner's last check refuses it (the worker counts it stale)."""
    kv = MemoryKv("memory://")
    spec = emit(journal, task="tests.coordination.count_run")
    first, second = taken_over(journal, spec)
    with use_kv(kv):
        with pytest.raises(Superseded):
            services.job_occurrence_run(first, journal=journal)
        assert [r["fencing_token"] for r in jobtasks.RUNS] == [first.fencing_token]  # handler code: at least once
        (row,) = selectors.occurrence_list(job_id=spec.id, journal=journal)
    assert [(s.fencing_token, s.by_token) for s in row.superseded] == [(first.fencing_token, second.fencing_token)]


def test_the_task_sees_its_occurrence_only_inside_the_runner(journal: EventJournal, table: str) -> None:
    kv = MemoryKv("memory://")
    spec = emit(journal, table=table)
    assert current_occurrence() is None
    with use_kv(kv):
        assert services.jobs_drain(services.jobs_channel(spec), journal=journal)["processed"] == 1
    assert current_occurrence() is None
    assert applied(kv, table) == 1 and jobtasks.RUNS[0]["id"] == f"{spec.id}@{T0}"


def test_kv_sweep_checks_its_occurrence_before_each_batch(journal: EventJournal) -> None:
    """The built-in kv.sweep: a superseded run deletes nothing; a live one sweeps in batches."""
    kv = MemoryKv("memory://")
    kv.commit("coordination/sweep/t", [Put(f"k{i}", i, ttl_ms=1) for i in range(5)])
    spec = emit(journal)
    first, second = taken_over(journal, spec)
    with running(run(first, journal, kv)), pytest.raises(Superseded):
        services.kv_sweep(kv=kv, batch=2)
    with running(run(second, journal, kv)):
        assert services.kv_sweep(kv=kv, batch=2) == 5
    assert services.kv_sweep(kv=kv) == 0  # outside an occurrence (a manual run): unfenced
