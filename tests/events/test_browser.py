"""The journal page in a real headless Chromium: counts, DLQ with last error, replay through htmx."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from botmesh_admin.events import Envelope, RetryPolicy, use_journal
from botmesh_admin.events.memory import MemoryEventJournal
from botmesh_admin.tenancy import services
from tests.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def journal():
    get_user_model().objects.create_user("dana", password="dana-password-1")
    services.tenant_create("acme", name="ACME")
    services.membership_set("acme", username="dana", role="admin")
    journal = MemoryEventJournal(policy=RetryPolicy(max_attempts=1, jitter=0.0))
    with use_journal(journal):
        yield journal


def test_dead_letter_is_replayed_from_the_journal_page(page, journal, screenshot_dir) -> None:
    for n in range(3):
        journal.append(
            Envelope(
                type="channels.send",
                tenant="acme",
                payload={"n": n},
                idempotency_key=f"s{n}",
                channel="outbox",
            )
        )
    leased = journal.claim(journal.clock(), 60_000, "outbox")
    journal.fail(leased.id, journal.clock(), leased.fencing_token, "131047: re-engagement window closed")
    login(page, "dana", "dana-password-1")
    page.goto("/t/acme/journal/")
    assert page.locator("nav.sidenav a", has_text="Journal").count() == 1
    assert page.locator("[data-testid=count-dead] strong").inner_text() == "1"
    assert "131047" in page.locator("[data-testid=dlq]").inner_text()
    page.screenshot(path=str(screenshot_dir / "journal-dlq.png"), full_page=True)
    page.click(f"[data-testid=dlq] [data-testid=replay-{leased.id}]")
    page.wait_for_selector(f"text=Event {leased.id} replayed")
    assert page.locator("[data-testid=count-dead] strong").inner_text() == "0"
    assert page.url.endswith("/t/acme/journal/")  # swapped in place by htmx, no navigation
    assert journal.get(leased.id).state == "pending"
    page.select_option("[data-testid=filter-channel]", "outbox")
    page.select_option("[data-testid=filter-state]", "pending")
    page.click("form.events-filters button[type=submit]")
    page.wait_for_function("document.querySelectorAll('tr[data-state]').length === 3")


def test_replay_of_a_done_event_asks_in_a_dialog_and_a_dead_letter_does_not(page, journal, screenshot_dir) -> None:
    for n in range(2):
        journal.append(Envelope(type="channels.send", tenant="acme", payload={"n": n}, idempotency_key=f"d{n}"))
    leased = journal.claim(journal.clock(), 60_000)
    done = journal.ack(leased.id, journal.clock(), leased.fencing_token)
    leased = journal.claim(journal.clock(), 60_000)
    dead = journal.fail(leased.id, journal.clock(), leased.fencing_token, "boom")
    dialogs: list[str] = []

    def answer(dialog) -> None:  # the first time she cancels, then she says yes
        dialogs.append(dialog.message)
        dialog.dismiss() if len(dialogs) == 1 else dialog.accept()

    page.on("dialog", answer)
    login(page, "dana", "dana-password-1")
    page.goto("/t/acme/journal/?state=done")
    page.click(f"[data-testid=replay-{done.id}]")
    page.wait_for_timeout(300)  # a dismissed dialog sends nothing: give a wrong request the time to land
    assert dialogs and "handled already" in dialogs[0] and journal.get(done.id).state == "done"
    page.click(f"[data-testid=replay-{done.id}]")
    page.wait_for_selector(f"text=Event {done.id} replayed")
    assert len(dialogs) == 2 and journal.get(done.id).state == "pending"
    page.goto("/t/acme/journal/")
    page.click(f"[data-testid=dlq] [data-testid=replay-{dead.id}]")
    page.wait_for_selector(f"text=Event {dead.id} replayed")
    assert len(dialogs) == 2 and journal.get(dead.id).state == "pending"  # one click, no dialog
