"""Fixtures of the channels tests: the shared fixture files, a tenant with both channels configured."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from botmesh_admin.demo import fixtures_dir

WA_PHONE_NUMBER_ID = "106540352242922"
WA_VERIFY_TOKEN = "verify-me-1234"
WA_ACCESS_TOKEN = "EAAG-fixture-access-token"
TG_BOT_TOKEN = "600000000:AAF-fixture-bot-token-not-real-xyz"


@pytest.fixture(scope="module")
def fake_provider_server():
    """One local fake provider server per test module (``botmesh_admin.channels.testing``)."""
    from botmesh_admin.channels.testing import FakeProviderServer

    with FakeProviderServer() as server:
        yield server


@pytest.fixture
def fake(fake_provider_server):
    """The module's fake provider server, reset for this test: no scripted answers, no delay, no requests."""
    fake_provider_server.reset()
    fake_provider_server.set_delay(0)
    return fake_provider_server


def fixture_path(*parts: str) -> Path:
    return fixtures_dir().joinpath(*parts)


def load_json(*parts: str) -> Any:
    return json.loads(fixture_path(*parts).read_text(encoding="utf-8"))


def whatsapp_bodies() -> dict[str, dict[str, Any]]:
    """Return ``{file name: parsed body}`` of the pretty-printed WhatsApp fixtures."""
    return {p.name: load_json("whatsapp", p.name) for p in sorted(fixture_path("whatsapp").glob("0*.json"))}


def telegram_updates() -> dict[str, dict[str, Any]]:
    """Return ``{file name: update}`` of the Telegram fixtures."""
    return {p.name: load_json("telegram", p.name) for p in sorted(fixture_path("telegram").glob("0*.json"))}


@dataclass
class Configured:
    tenant: str
    app_secret: str
    telegram_secret: str


@pytest.fixture
def configured(db) -> Configured:
    """Tenant ``tienda`` with WhatsApp channel ``main`` and Telegram channel ``bot``, fixture secrets."""
    from botmesh_admin.channels import services
    from botmesh_admin.tenancy.services import tenant_create

    tenant_create("tienda", name="Tienda")
    tenant_create("otra", name="Otra")
    app_secret = load_json("whatsapp", "raw", "signatures.json")["app_secret"]
    telegram_secret = load_json("telegram", "meta.json")["secret_token"]
    services.channel_config_set(
        "tienda",
        kind="whatsapp",
        name="main",
        phone_number_id=WA_PHONE_NUMBER_ID,
        display_phone_number="+1 555 078 3881",
        app_secret=app_secret,
        verify_token=WA_VERIFY_TOKEN,
        access_token=WA_ACCESS_TOKEN,
    )
    services.channel_config_set(
        "tienda",
        kind="telegram",
        name="bot",
        bot_username="tienda_bot",
        bot_token=TG_BOT_TOKEN,
        webhook_secret=telegram_secret,
    )
    return Configured("tienda", app_secret, telegram_secret)
