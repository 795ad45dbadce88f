"""The JobStore contract, on the memory store and the Kv store over every Kv backend."""

from __future__ import annotations

import pytest

from botmesh_admin.coordination import StaleFence
from botmesh_admin.coordination.domain import JobSettings, JobState, Schedule
from botmesh_admin.coordination.stores.base import JobStore
from botmesh_admin.coordination.stores.kv import KvJobStore
from botmesh_admin.coordination.stores.memory import MemoryJobStore
from botmesh_admin.errors import Conflict
from tests.backends import KV_BACKENDS, open_kv, unique_id


@pytest.fixture(params=["memory", *(f"kv-{name}" for name in KV_BACKENDS)])
def job_store(request: pytest.FixtureRequest) -> JobStore:
    """The memory store, then the Kv store on every Kv backend."""
    if request.param == "memory":
        return MemoryJobStore()
    kv = open_kv(request.param.removeprefix("kv-"), request)
    return KvJobStore(kv, namespace=unique_id())


def test_store_implements_the_protocol(job_store: JobStore) -> None:
    assert isinstance(job_store, JobStore)


def test_settings_are_saved_with_compare_and_set(job_store: JobStore) -> None:
    """A stale version is a conflict carrying the current version; nothing is overwritten."""
    first = JobSettings(Schedule.interval(30), updated_by="user:ana")
    assert job_store.settings_get("kv.sweep") is None
    assert job_store.settings_put("kv.sweep", first, expected_version=0) == 1
    second = JobSettings(Schedule.cron("0 3 * * *"), enabled=False, updated_by="user:bo")
    assert job_store.settings_put("kv.sweep", second, expected_version=1) == 2
    with pytest.raises(Conflict) as info:
        job_store.settings_put("kv.sweep", first, expected_version=1)
    assert info.value.current_version == 2
    with pytest.raises(Conflict):
        job_store.settings_put("other", first, expected_version=3)
    assert job_store.settings_get("kv.sweep") == (second, 2)


def test_state_writes_are_fenced(job_store: JobStore) -> None:
    """A deposed leader (older fence) cannot overwrite the new leader's progress."""
    job_store.state_put({"a": JobState(100, 100), "b": JobState(50)}, fence=7)
    job_store.state_put({"a": JobState(200, 200)}, fence=9)
    with pytest.raises(StaleFence):
        job_store.state_put({"a": JobState(150, 150), "b": JobState(999)}, fence=7)
    assert job_store.state_get("a") == JobState(200, 200)
    assert job_store.state_get("b") == JobState(50)  # the refused batch changed nothing
    job_store.state_put({"b": JobState(300)}, fence=9)  # the same leader writes again
    assert job_store.state_get("b") == JobState(300) and job_store.state_get("c") is None
