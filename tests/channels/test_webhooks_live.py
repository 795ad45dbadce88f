"""Concurrent deliveries over real HTTP: a redelivered body is journaled once, distinct updates all are."""

from __future__ import annotations

import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from botmesh_admin.events import connect_journal, use_journal

from .conftest import fixture_path, load_json, telegram_updates

SIGNATURES = load_json("whatsapp", "raw", "signatures.json")


def post(url: str, raw: bytes, headers: dict[str, str]) -> int:
    request = urllib.request.Request(
        url, data=raw, method="POST", headers={"Content-Type": "application/json", **headers}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status


@pytest.mark.django_db(transaction=True)
def test_parallel_redeliveries_are_journaled_once(configured, live_server) -> None:
    journal = connect_journal("memory://")
    raw = fixture_path("whatsapp", "raw", "08_batch.json").read_bytes()
    wa_headers = {"X-Hub-Signature-256": SIGNATURES["signatures"]["08_batch.json"]}
    tg_headers = {"X-Telegram-Bot-Api-Secret-Token": configured.telegram_secret}
    jobs = [(f"{live_server.url}/webhooks/whatsapp/tienda", raw, wa_headers)] * 8
    jobs += [
        (f"{live_server.url}/webhooks/telegram/tienda/bot", fixture_path("telegram", name).read_bytes(), tg_headers)
        for name in sorted(telegram_updates())
    ] * 2
    with use_journal(journal), ThreadPoolExecutor(max_workers=8) as pool:
        statuses = list(pool.map(lambda job: post(*job), jobs))
    assert statuses == [200] * len(jobs)
    records = journal.list(tenant="tienda", limit=200)
    assert sorted(r.type for r in records).count("whatsapp.webhook") == 1
    assert len([r for r in records if r.type == "telegram.update"]) == len(telegram_updates())
