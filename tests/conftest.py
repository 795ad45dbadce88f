"""Suite-wide fixtures: service URLs and the shared Redis Cluster."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests import backends, services

_cluster: services.RedisCluster | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _cluster
    from botmesh_admin.demo import fixtures_dir

    fixtures = fixtures_dir()
    if not (fixtures / "ledger" / "messages.jsonl").is_file():  # hundreds of tests read them: say it once
        pytest.exit(
            f"shared fixtures not found in {fixtures}: set BOTMESH_FIXTURES to the shared fixtures "
            "folder (../shared/fixtures next to this repository)",
            returncode=4,
        )
    # The controller (or a run without xdist); the quick profile runs no Redis Cluster test.
    if not hasattr(config, "workerinput") and not config.getoption("quick"):
        _cluster = services.start_cluster_if_possible()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--quick",
        action="store_true",
        help="the quick profile (./dev test --quick): see tests/quick.py",
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    from tests import quick

    return quick.ignored(collection_path, config) or None  # None: let the other rules decide


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from tests import quick

    quick.deselect(config, items)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _cluster is not None:
        _cluster.stop()


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """URL of the test PostgreSQL database (skip/fail if absent)."""
    return services.need("BOTMESH_TEST_POSTGRES_URL", "PostgreSQL")


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of the test Redis server (skip/fail if absent)."""
    return services.need("BOTMESH_TEST_REDIS_URL", "Redis")


@pytest.fixture(scope="session")
def redis_cluster_url() -> str:
    """``redis+cluster://`` URL of the three-master test cluster (skip/fail if absent)."""
    return services.need("BOTMESH_TEST_REDIS_CLUSTER_URL", "Redis Cluster")


@pytest.fixture(params=backends.KV_BACKENDS)
def any_kv(request: pytest.FixtureRequest):
    """A fresh DurableKv of each backend in turn (use unique table names / tenant ids)."""
    return backends.open_kv(request.param, request)


@pytest.fixture
def tenant_id() -> str:
    """A tenant id unique to this test (PostgreSQL and Redis are shared across workers)."""
    return backends.unique_id()


CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


@pytest.fixture(scope="session")
def chromium():
    """Debian's Chromium driven by Playwright (no browser download); skip/fail if absent."""
    import shutil

    path = os.environ.get("BOTMESH_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        if services.REQUIRE:
            pytest.fail("BOTMESH_REQUIRE_SERVICES=1 but chromium is not installed")
        pytest.skip("chromium not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(chromium, live_server):
    """A fresh browser page; ``page.base_url`` is the live server's URL."""
    context = chromium.new_context(viewport={"width": 1280, "height": 800}, base_url=live_server.url)
    pg = context.new_page()
    pg.set_default_timeout(15000)
    yield pg
    context.close()


@pytest.fixture
def screenshot_dir() -> os.PathLike[str]:
    """Where browser tests save screenshots for a person to look at (``var/screenshots``)."""
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "var" / "screenshots"
    path.mkdir(parents=True, exist_ok=True)
    return path


def login(page, username: str, password: str) -> None:
    """Log in through the real login form."""
    page.goto("/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")


@pytest.fixture(autouse=True)
def fresh_default_stores():
    """Give every test its own in-memory default Kv and journal.

    The process-wide defaults would otherwise carry state (login failure counts,
    metrics, traces, journal records) from one test to the next in an xdist worker.
    A test that needs a shared backend (real worker processes) nests its own
    ``use_kv`` / ``use_journal``.
    """
    from botmesh_admin.events import use_journal
    from botmesh_admin.events.memory import MemoryEventJournal
    from botmesh_admin.kv.memory import MemoryKv
    from botmesh_admin.kv.runtime import use_kv

    with use_kv(MemoryKv()), use_journal(MemoryEventJournal()):
        yield
