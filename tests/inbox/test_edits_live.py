"""An edit is never lost (issue 15, item 2), over real HTTP with the worker running.

200 Telegram original + ``edited_message`` pairs are posted as signed webhooks
to a live server while three event workers drain the ``inbound`` channel — in
each pair both at once, the edit first, or the edit 50 ms after — on the
SQLite and the PostgreSQL Kv and journal. Before the fix about one pair in ten
kept the original text, with no edit recorded and no error; and an edit
projected before its original kept no previous text.
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from botmesh_admin.demo import fixtures_dir
from botmesh_admin.events import connect_journal, use_journal
from botmesh_admin.events.handlers import dispatch
from botmesh_admin.events.worker import EventWorker
from botmesh_admin.kv.runtime import use_kv
from tests import backends
from tests.events.journals import drop, with_namespace

PAIRS = 200
CHATS = 20
WORKERS = 3
BOT_TOKEN = "600000000:AAF-fixture-bot-token-not-real-xyz"
DATE = 1764489600  # Unix seconds (Telegram's ``date``)


def _journal_url(name: str, request: pytest.FixtureRequest) -> str:
    if name == "sqlite":
        return f"sqlite:///{request.getfixturevalue('tmp_path')}/journal.sqlite3"
    url = with_namespace(request.getfixturevalue("postgres_url"))
    request.addfinalizer(lambda: drop(url))
    return url


def _update(update_id: int, chat: int, message_id: int, text: str, *, edited: bool) -> bytes:
    message = {
        "message_id": message_id,
        "from": {"id": chat, "first_name": "Ana"},
        "chat": {"id": chat, "type": "private"},
        "date": DATE + message_id,
        "text": text,
    }
    if edited:
        message["edit_date"] = DATE + message_id + 30
    return json.dumps({"update_id": update_id, "edited_message" if edited else "message": message}).encode()


def _post(url: str, body: bytes, secret: str) -> int:
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "X-Telegram-Bot-Api-Secret-Token": secret},
    )
    with urllib.request.urlopen(request, timeout=20) as response:
        return response.status


def _get(url: str, token: str) -> dict:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=20) as response:
        return json.loads(response.read())


class Workers:
    """``WORKERS`` threads draining ``inbound`` until stopped (the live worker of an installation)."""

    def __init__(self, journal) -> None:
        self.journal = journal
        self.stopped = threading.Event()
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(WORKERS)]

    def _run(self) -> None:
        from django.db import connections

        worker = EventWorker(self.journal, lease_ms=30_000, channel="inbound")
        try:
            while not self.stopped.is_set():
                if not sum(worker.run_batch(dispatch, 20).values()):
                    time.sleep(0.01)
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)
        finally:
            connections.close_all()

    def __enter__(self) -> Workers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join(timeout=30)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
@pytest.mark.django_db(transaction=True)
def test_no_edit_is_lost_whatever_the_order_and_timing(backend, request, live_server):
    from botmesh_admin.channels.services import channel_config_set
    from botmesh_admin.tenancy import services as tenancy

    kv = backends.open_kv(backend, request)
    journal = connect_journal(_journal_url(backend, request))
    request.addfinalizer(journal.close)
    tenant = backends.unique_id("edits")
    secret = json.loads((fixtures_dir() / "telegram" / "meta.json").read_text())["secret_token"]
    with use_kv(kv), use_journal(journal):
        tenancy.tenant_create(tenant, name="Edits")
        channel_config_set(tenant, kind="telegram", name="bot", bot_token=BOT_TOKEN, webhook_secret=secret)
        token = tenancy.token_create(tenant, name="ci")[1]
        url = f"{live_server.url}/webhooks/telegram/{tenant}/bot"
        rng = random.Random(15)
        pairs = [(700_000_100 + i % CHATS, i + 1) for i in range(PAIRS)]

        def original(i: int) -> int:
            chat, message_id = pairs[i]
            return _post(url, _update(2 * i + 1, chat, message_id, f"original {i}", edited=False), secret)

        def edit(i: int, delay_s: float = 0.0) -> int:
            time.sleep(delay_s)
            chat, message_id = pairs[i]
            return _post(url, _update(2 * i + 2, chat, message_id, f"edited {i}", edited=True), secret)

        def later(i: int) -> list[int]:
            return [original(i), edit(i, 0.05)]  # the edit 50 ms after its original was answered

        started = time.monotonic()
        with Workers(journal) as workers, ThreadPoolExecutor(max_workers=12) as pool:
            jobs = []
            for i in range(PAIRS):
                mode = rng.choice(("together", "edit first", "50 ms after"))
                if mode == "together":
                    jobs += [pool.submit(original, i), pool.submit(edit, i)]
                elif mode == "edit first":
                    jobs += [pool.submit(edit, i), pool.submit(original, i)]
                else:
                    jobs.append(pool.submit(later, i))
            results = [job.result() for job in jobs]
            statuses = [s for r in results for s in (r if isinstance(r, list) else [r])]
            assert statuses == [200] * (2 * PAIRS)
            posted = time.monotonic() - started
            deadline = time.monotonic() + 60
            while journal.counts(tenant).get(("pending", "inbound")) and time.monotonic() < deadline:
                time.sleep(0.05)
            workers.stopped.set()
        elapsed = time.monotonic() - started
        assert not workers.errors, workers.errors
        assert journal.counts(tenant) == {("done", "inbound"): 2 * PAIRS}

        conversations = _get(f"{live_server.url}/api/v1/tenants/{tenant}/conversations?limit=200", token)["items"]
        assert len(conversations) == CHATS
        shown: list[dict] = []
        for conv in conversations:
            page = _get(
                f"{live_server.url}/api/v1/tenants/{tenant}/conversations/{conv['id']}/messages?limit=200", token
            )
            shown += page["items"]
        # Found by what the agent reads (message ids belong to the channel code): "edited i", once.
        by_pair = {int(m["text"].split()[-1]): m for m in shown}
        lost = [
            i
            for i in range(PAIRS)
            if (m := by_pair.get(i)) is None
            or m["text"] != f"edited {i}"
            or [e["text"] for e in m["edits"]] != [f"original {i}"]
        ]
        print(
            f"EDITS {backend}: {PAIRS} pairs, {len(lost)} lost, posted in {posted:.1f} s, "
            f"all projected in {elapsed:.1f} s"
        )
        assert lost == [], f"{len(lost)} of {PAIRS} edits lost, e.g. {[by_pair.get(i) for i in lost[:2]]}"
        assert len(shown) == PAIRS  # one message per pair: the edit never made a second one
        assert all(m["timestamp_ms"] == (DATE + pairs[i][1]) * 1000 for i, m in by_pair.items())
        assert sum(c["inbound_count"] for c in conversations) == PAIRS
