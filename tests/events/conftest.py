"""Fixtures of the journal tests: ``journal`` over every backend, a driveable clock."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from botmesh_admin.events import EventJournal, RetryPolicy, connect_journal

from . import journals


class FakeClock:
    """A clock in epoch ms that moves only when told to."""

    def __init__(self, start: int = 1_700_000_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> int:
        self.now += ms
        return self.now


def backend_params(names: tuple[str, ...]) -> list[object]:
    return [pytest.param(n, marks=pytest.mark.services) if n in journals.SERVERS else n for n in names]


def url_for(backend: str, request: pytest.FixtureRequest, directory: Path) -> str:
    """Return a fresh journal URL of ``backend`` (skip/fail when its server is absent)."""
    if backend == "memory":
        return "memory://"
    if backend == "file":
        return f"file://{directory}/journal.json"
    if backend == "sqlite":
        return f"sqlite:///{directory}/journal.sqlite3"
    server = request.getfixturevalue({"postgresql": "postgres_url", "redis": "redis_url"}[backend])
    url = journals.with_namespace(server)
    request.addfinalizer(lambda: journals.drop(url))
    return url


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def policy() -> RetryPolicy:
    """Three attempts, 1 s base backoff, no jitter (exact times)."""
    return RetryPolicy(max_attempts=3, base_delay_ms=1000, max_delay_ms=60_000, jitter=0.0)


@pytest.fixture(params=backend_params(journals.ALL))
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=backend_params(journals.SHARED))
def shared_backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def journal_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return url_for(backend, request, tmp_path)


@pytest.fixture
def open_journal(journal_url: str, clock: FakeClock, policy: RetryPolicy) -> Iterator[Callable[..., EventJournal]]:
    """Open (or reopen, as after a restart) the test's journal; all are closed at the end."""
    opened: list[EventJournal] = []

    def open_(**overrides: object) -> EventJournal:
        options: dict[str, object] = {"clock": clock, "policy": policy, **overrides}
        j = connect_journal(journal_url, **options)  # type: ignore[arg-type]
        opened.append(j)
        return j

    yield open_
    for j in opened:
        j.close()


@pytest.fixture
def journal(open_journal: Callable[..., EventJournal]) -> EventJournal:
    """A fresh journal of each backend in turn."""
    return open_journal()
