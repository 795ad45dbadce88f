"""The demo's one dead letter (issue 20, item 10): the demo loader journals a labelled demo fault, the
worker retries it into the dead letters, and Replay on the journal page gets it processed."""

from __future__ import annotations

import threading

import pytest

from botmesh_admin import demo
from botmesh_admin.demo import ADMIN_PASSWORD, ADMIN_USER, DemoContext, ensure_accounts, fixtures_dir
from botmesh_admin.events import RetryPolicy, use_journal
from botmesh_admin.events import demo as events_demo
from botmesh_admin.events.memory import MemoryEventJournal
from botmesh_admin.events.services import journal_drain
from tests.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def worker():
    """What the Celery worker and beat's safety net do in ``./dev run``: drain the demo channel."""
    # The real five attempts, with short backoffs so the test takes seconds.
    journal = MemoryEventJournal(policy=RetryPolicy(max_attempts=5, base_delay_ms=20, max_delay_ms=100, jitter=0.0))
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            if not sum(journal_drain(channel=events_demo.DEMO_CHANNEL, limit=20).values()):
                stop.wait(0.05)

    with use_journal(journal):
        thread = threading.Thread(target=drain, daemon=True)
        thread.start()
        try:
            yield journal
        finally:
            stop.set()
            thread.join(timeout=10)


def test_the_demo_fault_loads_first_and_is_waited_for_last() -> None:
    assert demo.LOADERS[0] == "botmesh_admin.events.demo:load"
    assert demo.LOADERS[-1] == "botmesh_admin.events.demo:settle"


def test_the_demo_has_one_dead_letter_and_replaying_it_from_the_journal_page_processes_it(
    page, worker, live_server, screenshot_dir
) -> None:
    ctx = DemoContext(base_url=live_server.url, tokens=ensure_accounts(), fixtures=fixtures_dir())
    assert "demo fault" in events_demo.load(ctx)
    assert events_demo.settle(ctx) == "journal: the demo fault is a dead letter"
    [dead] = worker.list(tenant=demo.DEMO_TENANT, state="dead")
    assert dead.attempts == 5 and "deliberate demo fault (attempt 5 of 5)" in dead.last_error

    login(page, ADMIN_USER, ADMIN_PASSWORD)
    page.goto(f"/t/{demo.DEMO_TENANT}/")
    card = " ".join(page.locator("[data-testid=card-journal]").inner_text().split())
    assert "1 dead letter · 0 waiting · 1 event" in card, card
    page.goto(f"/t/{demo.DEMO_TENANT}/journal/")
    dlq = page.locator("[data-testid=dlq] tbody tr")
    assert dlq.count() == 1
    assert dlq.locator("[data-testid=demo-fault]").inner_text() == "demo fault"
    assert "deliberate demo fault" in dlq.locator(".events-error").inner_text()
    page.screenshot(path=str(screenshot_dir / "journal-demo-fault.png"), full_page=True)

    page.click(f"[data-testid=dlq] [data-testid=replay-{dead.id}]")
    page.wait_for_selector(f"text=Event {dead.id} replayed")
    page.goto(f"/t/{demo.DEMO_TENANT}/journal/{dead.id}/")
    for _ in range(50):  # the worker takes the replayed record within a fraction of a second
        if page.locator("[data-testid=state]").inner_text() == "done":
            break
        page.wait_for_timeout(100)
        page.reload()
    assert page.locator("[data-testid=state]").inner_text() == "done"
    assert page.locator("[data-testid=demo-fault]").count() == 1
    page.goto(f"/t/{demo.DEMO_TENANT}/")
    assert page.locator("[data-testid=card-journal] .overview-value").inner_text() == "0"
