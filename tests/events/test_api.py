"""``/api/v1/tenants/{tenant}/events…``, the journal pages, ``event_publish`` and the drain task."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from botmesh_admin.celery import app as celery_app
from botmesh_admin.errors import ValidationError
from botmesh_admin.events import EventRecord, RetryPolicy, use_journal
from botmesh_admin.events.handlers import register, unregister
from botmesh_admin.events.memory import MemoryEventJournal
from botmesh_admin.events.services import NewEvent, event_publish, event_publish_many
from botmesh_admin.events.tasks import beat_entries, drain
from botmesh_admin.tenancy import services as tenancy

from .conftest import FakeClock


@dataclass
class World:
    journal: MemoryEventJournal
    clock: FakeClock
    admin: str
    agent: str
    other: str


@pytest.fixture
def world(db) -> Iterator[World]:
    users = get_user_model()
    users.objects.create_user("ada", password="ada-password-1")
    users.objects.create_user("ben", password="ben-password-1")
    tenancy.tenant_create("acme", name="ACME")
    tenancy.tenant_create("globex", name="Globex")
    tenancy.membership_set("acme", username="ada", role="admin")
    tenancy.membership_set("acme", username="ben", role="agent")
    clock = FakeClock()
    journal = MemoryEventJournal(clock=clock, policy=RetryPolicy(max_attempts=1, jitter=0.0))
    with use_journal(journal):
        yield World(
            journal=journal,
            clock=clock,
            admin=tenancy.token_create("acme", name="ci")[1],
            agent=tenancy.token_create("acme", name="bot", role="agent")[1],
            other=tenancy.token_create("globex", name="ci")[1],
        )


def api(token: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def kill(journal: MemoryEventJournal, clock: FakeClock, record: EventRecord, error: str) -> EventRecord:
    """Dead-letter the next ready record of ``record``'s channel (max_attempts is 1); return it."""
    leased = journal.claim(clock.now, 1000, record.channel)
    assert leased is not None
    return journal.fail(leased.id, clock.now, leased.fencing_token, error)


def publish(n: int, tenant: str = "acme", channel: str | None = None) -> list[EventRecord]:
    return [
        event_publish(tenant, type="inbox.message", payload={"n": i}, idempotency_key=f"{channel}-{i}", channel=channel)
        for i in range(n)
    ]


# -- the REST API ------------------------------------------------------------------------------


def test_list_pages_with_a_cursor(world: World, client: Client) -> None:
    ids = []
    for i in range(5):
        ids.append(event_publish("acme", type="inbox.message", payload={"n": i}, idempotency_key=f"k{i}").id)
        world.clock.advance(1)
    first = client.get("/api/v1/tenants/acme/events?limit=2", **api(world.admin)).json()
    assert [e["id"] for e in first["items"]] == ids[::-1][:2]
    second = client.get(f"/api/v1/tenants/acme/events?limit=2&after={first['next']}", **api(world.admin)).json()
    assert [e["id"] for e in second["items"]] == ids[::-1][2:4]
    last = client.get(f"/api/v1/tenants/acme/events?limit=2&after={second['next']}", **api(world.admin)).json()
    assert [e["id"] for e in last["items"]] == [ids[0]] and last["next"] is None
    assert first["items"][0]["payload"] == {"n": 4} and first["items"][0]["state"] == "pending"


def test_list_filters_by_state_and_channel(world: World, client: Client) -> None:
    [default] = publish(1)
    [outbox] = publish(1, channel="outbox")
    kill(world.journal, world.clock, outbox, "403 blocked")
    dead = client.get("/api/v1/tenants/acme/events?state=dead", **api(world.admin)).json()["items"]
    assert [(e["id"], e["last_error"]) for e in dead] == [(outbox.id, "403 blocked")]
    only_default = client.get("/api/v1/tenants/acme/events?channel=default", **api(world.admin)).json()
    assert [e["id"] for e in only_default["items"]] == [default.id]
    bad = client.get("/api/v1/tenants/acme/events?state=zombie", **api(world.admin))
    assert bad.status_code == 422 and bad.json()["field"] == "state"


def test_another_tenants_event_is_404_and_never_listed(world: World, client: Client) -> None:
    [theirs] = publish(1, tenant="globex")
    assert client.get(f"/api/v1/tenants/acme/events/{theirs.id}", **api(world.admin)).status_code == 404
    assert client.get("/api/v1/tenants/acme/events", **api(world.admin)).json()["items"] == []
    assert client.post(f"/api/v1/tenants/acme/events/{theirs.id}/replay", **api(world.admin)).status_code == 404
    assert client.get(f"/api/v1/tenants/globex/events/{theirs.id}", **api(world.admin)).status_code == 404
    assert client.get(f"/api/v1/tenants/globex/events/{theirs.id}", **api(world.other)).status_code == 200


def test_replay_is_for_admins_and_only_for_dead_or_done(world: World, client: Client) -> None:
    [record] = publish(1)
    url = f"/api/v1/tenants/acme/events/{record.id}/replay"
    conflict = client.post(url, **api(world.admin))
    assert conflict.status_code == 409 and "pending" in conflict.json()["message"]
    kill(world.journal, world.clock, record, "boom")
    assert client.post(url, **api(world.agent)).status_code == 403
    resp = client.post(url, **api(world.admin))
    assert resp.status_code == 200
    body = resp.json()
    assert (body["state"], body["attempts"], body["last_error"]) == ("pending", 0, "boom")
    assert client.get(f"/api/v1/tenants/acme/events/{record.id}", **api(world.admin)).json()["state"] == "pending"


def test_event_counts_by_state_and_channel(world: World, client: Client) -> None:
    publish(2)
    [outbox] = publish(1, channel="outbox")
    kill(world.journal, world.clock, outbox, "x")
    body = client.get("/api/v1/tenants/acme/event-counts", **api(world.admin)).json()
    assert body["by_state"] == {"pending": 2, "leased": 0, "done": 0, "dead": 1}
    assert body["by_channel"]["default"]["pending"] == 2
    assert body["by_channel"]["outbox"]["dead"] == 1
    assert body["total"] == 3


def test_api_needs_a_token(world: World, client: Client) -> None:
    assert client.get("/api/v1/tenants/acme/events").status_code == 401


# -- publish, drain, beat ------------------------------------------------------------------------


def test_publish_is_idempotent_and_validated(world: World) -> None:
    first = event_publish("acme", type="crm.import", payload={"a": 1}, idempotency_key="job-1")
    again = event_publish("acme", type="crm.import", payload={"a": 2}, idempotency_key="job-1")
    assert again == first
    with pytest.raises(Exception) as info:
        event_publish("acme", type="crm.import", payload={"a": {1, 2}}, idempotency_key="job-2")
    assert getattr(info.value, "field", None) == "envelope.payload"


def test_publish_drains_the_channel_after_commit(world: World, django_capture_on_commit_callbacks) -> None:
    seen: list[str] = []
    register("test.published")(lambda record: seen.append(record.id))
    celery_app.conf.task_always_eager = True
    try:
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            record = event_publish("acme", type="test.published", payload={}, idempotency_key="p1", channel="outbox")
        assert seen == [] and len(callbacks) == 1  # nothing runs before the commit
        for callback in callbacks:
            callback()
    finally:
        celery_app.conf.task_always_eager = False
        unregister("test.published")
    assert seen == [record.id]
    assert world.journal.get(record.id).state == "done"


def test_publish_many_is_one_batch_idempotent_and_validated(world: World) -> None:
    before = event_publish("acme", type="ledger.message", payload={"n": 0}, idempotency_key="m0", channel="ledger")
    batch = [NewEvent("ledger.message", {"n": i}, f"m{i}", channel="ledger") for i in range(4)]
    published = event_publish_many("acme", [*batch, batch[1]])
    assert [p.new for p in published] == [False, True, True, True, False]
    assert published[0].record == before and published[4].record == published[1].record
    assert [p.record.payload["n"] for p in published] == [0, 1, 2, 3, 1]
    assert world.journal.counts("acme") == {("pending", "ledger"): 4}
    for bad, field in (
        ([batch[0], NewEvent("ledger.message", {"x": {1, 2}}, "m9")], "events[1].payload"),
        ([NewEvent("Bad Type", {}, "m8")], "events[0].type"),
        ([batch[0], {"type": "ledger.message"}], "events[1]"),
        ("not a list", "events"),
    ):
        with pytest.raises(ValidationError) as info:
            event_publish_many("acme", bad)  # type: ignore[arg-type]
        assert info.value.field == field
    with pytest.raises(ValidationError) as info:
        event_publish_many("ACME!", batch)
    assert info.value.field == "tenant"
    assert world.journal.counts("acme") == {("pending", "ledger"): 4}  # nothing of a refused batch
    assert event_publish_many("acme", []) == []


def test_publish_many_drains_each_channel_once_after_commit(world: World, django_capture_on_commit_callbacks) -> None:
    seen: list[str] = []
    register("test.batched")(lambda record: seen.append(record.payload["n"]))
    celery_app.conf.task_always_eager = True
    try:
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            published = event_publish_many(
                "acme",
                [NewEvent("test.batched", {"n": i}, f"b{i}", channel="outbox" if i % 2 else None) for i in range(6)],
            )
        assert seen == [] and len(callbacks) == 2  # one drain per channel, none before the commit
        with django_capture_on_commit_callbacks(execute=False) as again:
            event_publish_many("acme", [NewEvent("test.batched", {"n": 0}, "b0")])
        assert again == []  # nothing new: nothing to drain
        for callback in callbacks:
            callback()
    finally:
        celery_app.conf.task_always_eager = False
        unregister("test.batched")
    assert sorted(seen) == [0, 1, 2, 3, 4, 5]
    assert all(world.journal.get(p.record.id).state == "done" for p in published)


def test_drain_task_returns_the_worker_counts(world: World) -> None:
    register("test.drained")(lambda record: None)
    try:
        event_publish("acme", type="test.drained", payload={}, idempotency_key="d1")
        event_publish("acme", type="nobody.handles", payload={}, idempotency_key="d2")
        assert drain.run(None, 10) == {"processed": 1, "failed": 1, "stale": 0}
    finally:
        unregister("test.drained")
    assert world.journal.list(state="dead")[0].type == "nobody.handles"


def test_one_drain_task_takes_a_whole_backlog_batch_after_batch(world: World) -> None:
    """A large push is not drained ``limit`` records per wake-up: the task keeps taking batches."""
    seen: list[str] = []
    register("test.backlog")(lambda record: seen.append(record.id))
    try:
        for i in range(57):
            event_publish("acme", type="test.backlog", payload={}, idempotency_key=f"b{i}", channel="outbox")
        assert drain.run("outbox", 10) == {"processed": 57, "failed": 0, "stale": 0}
    finally:
        unregister("test.backlog")
    assert len(seen) == 57 and world.journal.counts("acme") == {("done", "outbox"): 57}


def test_beat_drains_every_channel_as_a_safety_net() -> None:
    entries = beat_entries()
    assert {e["kwargs"]["channel"] for e in entries.values()} == {
        None,
        "inbound",
        "ledger",
        "outbox",
        "demo",
        "crm-import",
        "campaigns-run",  # a run whose wake-up task was lost waited for the tick's stall check (5 s + a tick)
    }
    assert all(e["task"] == "events.drain" and e["schedule"] <= 10 for e in entries.values())
    assert set(entries) <= set(celery_app.conf.beat_schedule)


# -- the journal pages -------------------------------------------------------------------------------


def test_journal_page_shows_counts_list_and_dlq(world: World, client: Client) -> None:
    publish(2)
    [outbox] = publish(1, channel="outbox")
    kill(world.journal, world.clock, outbox, "131047: outside the 24-hour window")
    client.login(username="ada", password="ada-password-1")
    html = client.get("/t/acme/journal/").content.decode()
    assert 'data-testid="count-dead"' in html and "131047: outside the 24-hour window" in html
    assert html.count("<tr data-state=") == 3
    assert 'hx-trigger="every 5s"' in html
    dead_only = client.get("/t/acme/journal/?state=dead").content.decode()
    assert dead_only.count("<tr data-state=") == 1
    fragment = client.get("/t/acme/journal/table?channel=outbox", HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in fragment and fragment.count("<tr data-state=") == 1


def test_journal_page_is_for_admins_of_the_tenant(world: World, client: Client) -> None:
    client.login(username="ben", password="ben-password-1")
    assert client.get("/t/acme/journal/").status_code == 403
    client.login(username="ada", password="ada-password-1")
    assert client.get("/t/globex/journal/").status_code == 404
    nav = client.get("/t/acme/journal/").content.decode()
    assert 'href="/t/acme/journal/"' in nav


def test_replay_button_without_and_with_htmx(world: World, client: Client) -> None:
    [first, _] = publish(2)
    a = kill(world.journal, world.clock, first, "first")
    b = kill(world.journal, world.clock, first, "second")
    client.login(username="ada", password="ada-password-1")
    resp = client.post(f"/t/acme/journal/{a.id}/replay", {"state": "dead"})
    assert resp.status_code == 302 and resp["Location"] == "/t/acme/journal/?state=dead"
    assert world.journal.get(a.id).state == "pending"
    fragment = client.post(f"/t/acme/journal/{b.id}/replay", HTTP_HX_REQUEST="true").content.decode()
    assert f"Event {b.id} replayed" in fragment and "<html" not in fragment
    again = client.post(f"/t/acme/journal/{b.id}/replay", HTTP_HX_REQUEST="true")
    assert again.status_code == 409
    # Another tenant's event or a mistyped id: the 404 page, as the API says (a fresh user's report: a
    # redirect to the list that answered 200 with a flash naming nothing); nothing is replayed.
    [theirs] = publish(1, tenant="globex")
    for event_id in (theirs.id, "ev_000000000000000000000000"):
        missing = client.post(f"/t/acme/journal/{event_id}/replay", {"confirm": "yes"})
        assert missing.status_code == 404 and 'class="error-box" role="alert"' in missing.content.decode(), event_id
    assert world.journal.get(theirs.id) == theirs


def test_event_detail_shows_payload_and_last_error(world: World, client: Client) -> None:
    [record] = publish(1)
    kill(world.journal, world.clock, record, "ValueError: bad <b>html</b>")
    client.login(username="ada", password="ada-password-1")
    html = client.get(f"/t/acme/journal/{record.id}/").content.decode()
    assert "ValueError: bad &lt;b&gt;html&lt;/b&gt;" in html  # escaped
    assert "&quot;n&quot;: 0" in html or '"n": 0' in html
    resp = client.post(f"/t/acme/journal/{record.id}/replay", {"from": "detail"})
    assert resp["Location"] == f"/t/acme/journal/{record.id}/"
    assert client.get("/t/acme/journal/ev_nope/").status_code == 404


def test_replay_of_a_done_event_asks_first_and_a_dead_letter_does_not(world: World, client: Client) -> None:
    import re

    [first, second] = publish(2)
    leased = world.journal.claim(world.clock.now, 1000, first.channel)
    done = world.journal.ack(leased.id, world.clock.now, leased.fencing_token)
    dead = kill(world.journal, world.clock, second, "boom")
    client.login(username="ada", password="ada-password-1")
    page = client.get("/t/acme/journal/?state=done").content.decode()
    form = re.search(rf"<form[^>]*replay[^>]*>\s*(?:[^<]|<(?!button))*<button[^>]*replay-{done.id}", page).group(0)
    assert 'hx-confirm="Replay event' in form and '"confirm": "yes"' in form
    # Without JavaScript: the confirm page, nothing replayed yet; its button replays.
    asked = client.post(f"/t/acme/journal/{done.id}/replay?state=done", {"state": "done"})
    html = asked.content.decode()
    assert asked.status_code == 200 and 'data-testid="confirm-page"' in html and "handled already" in html
    assert world.journal.get(done.id).state == "done"
    action = re.search(r'<form method="post" action="([^"]+)">', html).group(1).replace("&amp;", "&")
    replayed = client.post(action, {"confirm": "yes"})
    assert replayed.status_code == 302 and replayed["Location"] == "/t/acme/journal/?state=done"
    assert world.journal.get(done.id).state == "pending"
    # From the detail page, with htmx (the dialog said yes): back to the detail page.
    leased = world.journal.claim(world.clock.now, 1000, first.channel)
    world.journal.ack(leased.id, world.clock.now, leased.fencing_token)
    assert "hx-confirm" in client.get(f"/t/acme/journal/{done.id}/").content.decode()
    answer = client.post(f"/t/acme/journal/{done.id}/replay?from=detail", {"confirm": "yes"}, HTTP_HX_REQUEST="true")
    assert answer["HX-Redirect"] == f"/t/acme/journal/{done.id}/"
    assert world.journal.get(done.id).state == "pending"
    # A dead letter stays one click, with or without JavaScript.
    dlq = client.get("/t/acme/journal/").content.decode()
    dead_form = re.search(rf"<form[^>]*replay[^>]*>\s*(?:[^<]|<(?!button))*<button[^>]*replay-{dead.id}", dlq).group(0)
    assert "hx-confirm" not in dead_form
    assert client.post(f"/t/acme/journal/{dead.id}/replay", {}).status_code == 302
    assert world.journal.get(dead.id).state == "pending"
