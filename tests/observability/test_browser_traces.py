"""Traces as an SRE works them, in headless Chromium (issue 20, items 1 and 10).

- A message trace is still there after an open inbox tab polled more often
  than the old cap of 500 traces, and the message's *trace* link in the thread
  opens it; a ledger push yields one small trace per record, linked to the push.
- The traces list is newest first by start, its filters are in a shareable
  URL, its conversation column links to the conversation, and the wording
  counts right ("1 span", "1 dead letter").
"""

from __future__ import annotations

import json

import pytest

from botmesh_admin.events.services import journal_drain
from botmesh_admin.kv.validation import now_ms
from botmesh_admin.observability import services, tracing
from tests.conftest import login

from .conftest import make_tenant
from .test_store_contract import span as span_dict
from .test_store_contract import tid

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
PASSWORD = "pw-12345678"  # ``make_tenant``'s member


def ledger(n: int) -> list[dict]:
    from botmesh_admin.demo import fixtures_dir

    lines = (fixtures_dir() / "ledger" / "messages.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return [dict(r, tenantId=None) for r in records if r["tenantId"] == "tienda"][:n]


def drain(channel: str) -> None:
    while sum(journal_drain(channel=channel, limit=500).values()):
        pass


def test_a_message_trace_outlives_a_burst_of_ui_polls_and_opens_from_the_thread(page, fresh_kv, screenshot_dir) -> None:
    tc = make_tenant()
    response = tc.bot.post(f"/api/v1/tenants/{tc.tenant}/ledger", ledger(3), content_type="application/json")
    assert response.status_code == 202, response.content
    drain("ledger")
    tracing.force_flush()
    login(page, f"u-{tc.tenant}", PASSWORD)
    page.goto(f"/t/{tc.tenant}/inbox/")
    # An open tab's polls, more than the 500 traces that were all the store kept: sent by the
    # page itself (its session, htmx's header), a few at a time.
    statuses = page.evaluate(
        """async (url) => {
            const out = [];
            for (let i = 0; i < 520; i += 8) {
                const batch = Array.from({length: 8}, () => fetch(url, {headers: {"HX-Request": "true"}}));
                out.push(...(await Promise.all(batch)).map(r => r.status));
            }
            return out;
        }""",
        f"/t/{tc.tenant}/inbox/_list",
    )
    assert statuses == [200] * 520
    tracing.force_flush()

    page.goto(f"/t/{tc.tenant}/inbox/")
    page.locator(".inbox-row a").first.click()
    link = page.locator(".inbox-msg a.inbox-trace").first
    link.wait_for()
    page.screenshot(path=str(screenshot_dir / "inbox-thread-trace-links.png"))
    link.click()
    page.wait_for_selector("[data-testid=span-tree]")
    assert page.locator("tr[data-span] strong", has_text="inbox.project").count() == 1
    assert page.locator("tr[data-span]").count() <= 3  # one record, one small trace
    assert "1 span ·" in page.locator("p.muted").first.inner_text()
    page.screenshot(path=str(screenshot_dir / "observability-message-trace.png"), full_page=True)

    page.click("[data-testid=span-link] a")  # back to the push that brought the record
    page.wait_for_selector("[data-testid=span-tree]")
    assert "/ledger" in page.locator("h1").inner_text()
    assert page.locator("tr[data-span]").count() < 5  # not 6 spans: the records' projections are their own


def test_the_trace_list_is_newest_first_with_filters_in_the_url_and_links_to_the_conversation(
    page, fresh_kv, screenshot_dir
) -> None:
    tc = make_tenant()
    t = now_ms() - 60_000.0
    # Written in this order, started in another: the worker's part of an older message comes late.
    services.trace_record(tc.tenant, [span_dict(tid(2), "a" * 16, None, "GET /t/{tenant}/inbox/", t + 2000, 3.0)])
    message = {"botmesh.conversation_id": "c-1"}
    services.trace_record(tc.tenant, [span_dict(tid(1), "a" * 16, None, "inbox.project", t, 4.0, **message)])
    services.trace_record(tc.tenant, [span_dict(tid(3), "a" * 16, None, "GET /t/{tenant}/traces/", t + 4000, 1.0)])
    login(page, f"u-{tc.tenant}", PASSWORD)
    page.goto(f"/t/{tc.tenant}/traces/")
    starts = page.eval_on_selector_all("tr[data-trace]", "rows => rows.map(r => Number(r.dataset.startMs))")
    assert starts == sorted(starts, reverse=True), starts
    order = page.eval_on_selector_all("tr[data-trace]", "rows => rows.map(r => r.dataset.trace)")
    assert [o for o in order if o in (tid(1), tid(2), tid(3))] == [tid(3), tid(2), tid(1)]

    page.select_option("select[name=kind]", "message")
    page.wait_for_function("document.querySelectorAll('tr[data-trace]').length === 1")
    assert "kind=message" in page.url
    shared = page.url
    page.goto(shared)  # the URL alone gives the same filtered list (a link someone shared)
    assert page.locator("tr[data-trace]").count() == 1
    assert page.locator("select[name=kind]").input_value() == "message"
    page.goto(f"/t/{tc.tenant}/traces/?conversation=c-1")
    assert page.locator("input[name=conversation]").input_value() == "c-1"
    assert page.eval_on_selector_all("tr[data-trace]", "rows => rows.map(r => r.dataset.trace)") == [tid(1)]
    href = page.locator("[data-testid=trace-conversation]").get_attribute("href")
    assert href == f"/t/{tc.tenant}/inbox/c-1/"
    page.screenshot(path=str(screenshot_dir / "observability-traces-filtered.png"), full_page=True)

    page.click(f"tr[data-trace='{tid(1)}'] a")
    page.wait_for_selector("[data-testid=span-tree]")
    summary = page.locator("p.muted").first.inner_text()
    assert "1 span ·" in summary and "1 spans" not in summary


def test_the_overview_and_journal_count_one_dead_letter_in_the_singular(page, fresh_kv, screenshot_dir) -> None:
    from botmesh_admin.events import Envelope, RetryPolicy, use_journal
    from botmesh_admin.events.memory import MemoryEventJournal

    tc = make_tenant(role="admin")
    journal = MemoryEventJournal(policy=RetryPolicy(max_attempts=1, jitter=0.0))
    with use_journal(journal):
        journal.append(
            Envelope(type="inbox.reply", tenant=tc.tenant, payload={}, idempotency_key="r1", channel="outbox")
        )
        leased = journal.claim(journal.clock(), 60_000, "outbox")
        journal.fail(leased.id, journal.clock(), leased.fencing_token, "131047: re-engagement window closed")
        login(page, f"u-{tc.tenant}", PASSWORD)
        page.goto(f"/t/{tc.tenant}/")
        card = " ".join(page.locator("[data-testid=card-journal]").inner_text().split())
        assert "1 dead letter ·" in card and "dead letters" not in card, card
        assert "1 event" in card and "1 events" not in card, card
        page.screenshot(path=str(screenshot_dir / "overview-one-dead-letter.png"), full_page=True)
        page.goto(f"/t/{tc.tenant}/journal/")
        assert page.locator("[data-testid=count-dead] strong").inner_text() == "1"
        page.screenshot(path=str(screenshot_dir / "journal-one-dead-letter.png"), full_page=True)
