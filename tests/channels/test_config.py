"""Channel configuration: validation, secrets encrypted/hashed at rest, key rotation, tenant isolation."""

from __future__ import annotations

import dataclasses

import pytest
from cryptography.fernet import Fernet
from django.db import connection

from botmesh_admin.channels import credentials, selectors, services
from botmesh_admin.channels.credentials import CredentialUnreadable
from botmesh_admin.channels.providers import (
    ConsoleProvider,
    TelegramProvider,
    UnconfiguredProvider,
    WhatsAppProvider,
    provider_for,
)
from botmesh_admin.errors import NotFound, ValidationError

from .conftest import TG_BOT_TOKEN, WA_ACCESS_TOKEN, WA_VERIFY_TOKEN


def use_keys(settings, *keys: str) -> None:
    settings.CONFIG = dataclasses.replace(settings.CONFIG, credentials_keys=list(keys))


def raw_rows() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM channels_channelconfig")
        return repr(cursor.fetchall())


def test_secrets_are_not_stored_in_clear(configured) -> None:
    dump = raw_rows()
    for secret in (configured.app_secret, WA_VERIFY_TOKEN, WA_ACCESS_TOKEN, TG_BOT_TOKEN, configured.telegram_secret):
        assert secret not in dump
    channel = selectors.channel_config_get("tienda", name="main")
    assert channel.secret("app_secret") == configured.app_secret
    assert channel.secret("access_token") == WA_ACCESS_TOKEN
    assert channel.check("verify_token", WA_VERIFY_TOKEN) and not channel.check("verify_token", "other")
    assert configured.app_secret not in repr(channel)
    assert channel.secrets_set == {"app_secret": True, "verify_token": True, "access_token": True}


def test_adding_a_new_key_in_front_keeps_old_values_readable_and_rotate_moves_them(configured, settings) -> None:
    old, new = Fernet.generate_key().decode(), "a passphrase for the new key"
    use_keys(settings, old)
    services.channel_config_set("tienda", kind="telegram", name="bot", bot_token=TG_BOT_TOKEN)
    use_keys(settings, new, old)
    assert selectors.channel_config_get("tienda", name="bot").secret("bot_token") == TG_BOT_TOKEN
    assert services.channel_credentials_rotate() == 3  # app secret + access token + bot token
    use_keys(settings, new)
    assert selectors.channel_config_get("tienda", name="bot").secret("bot_token") == TG_BOT_TOKEN
    assert selectors.channel_config_get("tienda", name="main").secret("access_token") == WA_ACCESS_TOKEN
    use_keys(settings, old)  # the old key alone no longer opens the re-encrypted values
    with pytest.raises(CredentialUnreadable):
        selectors.channel_config_get("tienda", name="bot").secret("bot_token")


def test_values_written_before_any_key_was_configured_stay_readable(configured, settings) -> None:
    use_keys(settings)
    services.channel_config_set("tienda", kind="telegram", name="bot", bot_token=TG_BOT_TOKEN)
    use_keys(settings, Fernet.generate_key().decode())
    assert selectors.channel_config_get("tienda", name="bot").secret("bot_token") == TG_BOT_TOKEN


def test_update_keeps_secrets_left_empty_and_clears_named_ones(configured) -> None:
    channel = services.channel_config_set(
        "tienda", kind="whatsapp", name="main", display_phone_number="", access_token=""
    )
    assert channel.display_phone_number is None and channel.secret("access_token") == WA_ACCESS_TOKEN
    channel = services.channel_config_set("tienda", kind="whatsapp", name="main", clear=("access_token",))
    assert channel.secrets_set == {"app_secret": True, "verify_token": True, "access_token": False}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"kind": "sms", "name": "x"}, "channel.kind"),
        ({"kind": "whatsapp", "name": "Bad Name"}, "channel.name"),
        ({"kind": "whatsapp", "name": "w"}, "channel.phone_number_id"),
        ({"kind": "whatsapp", "name": "w", "phone_number_id": "12a"}, "channel.phone_number_id"),
        ({"kind": "whatsapp", "name": "w", "phone_number_id": "106540352242922"}, "channel.phone_number_id"),
        ({"kind": "whatsapp", "name": "w", "phone_number_id": "1", "bot_token": TG_BOT_TOKEN}, "channel.bot_token"),
        ({"kind": "whatsapp", "name": "w", "phone_number_id": "1", "app_secret": "has space"}, "channel.app_secret"),
        ({"kind": "whatsapp", "name": "w", "phone_number_id": "1", "api_base_url": "ftp://x"}, "channel.api_base_url"),
        ({"kind": "telegram", "name": "t", "bot_token": "nope"}, "channel.bot_token"),
        ({"kind": "telegram", "name": "t", "webhook_secret": "has/slash"}, "channel.webhook_secret"),
        ({"kind": "telegram", "name": "t", "bot_username": "@x"}, "channel.bot_username"),
        ({"kind": "telegram", "name": "t", "phone_number_id": "1"}, "channel.phone_number_id"),
        ({"kind": "telegram", "name": "main"}, "channel.kind"),  # main is a WhatsApp channel
        ({"kind": "telegram", "name": "t", "clear": ("app_secret",)}, "channel.clear"),
    ],
)
def test_bad_values_name_the_field_and_write_nothing(configured, kwargs, field) -> None:
    before = raw_rows()
    with pytest.raises(ValidationError) as info:
        services.channel_config_set("tienda", **kwargs)
    assert info.value.field == field
    assert raw_rows() == before


def test_channels_are_tenant_isolated(configured) -> None:
    assert selectors.channel_config_list("otra") == []
    with pytest.raises(NotFound):
        selectors.channel_config_get("otra", name="main")
    with pytest.raises(NotFound):
        selectors.channel_for_whatsapp("otra", phone_number_id="106540352242922")
    with pytest.raises(NotFound):
        services.channel_config_delete("otra", name="main")
    with pytest.raises(NotFound):
        services.channel_config_set("nadie", kind="telegram", name="bot")
    # the same number may be configured by another tenant
    services.channel_config_set("otra", kind="whatsapp", name="main", phone_number_id="106540352242922")
    assert selectors.channel_for_whatsapp("tienda", phone_number_id="106540352242922").tenant == "tienda"


def test_provider_for_resolves_credentials_and_base_urls(configured, settings) -> None:
    settings.BOTMESH_WHATSAPP_API_BASE = "http://127.0.0.1:9/wa"
    main = selectors.channel_config_get("tienda", name="main")
    provider = provider_for("tienda", main)
    assert isinstance(provider, WhatsAppProvider) and provider.url == "http://127.0.0.1:9/wa/106540352242922/messages"
    assert WA_ACCESS_TOKEN not in repr(provider)
    bot = services.channel_config_set("tienda", kind="telegram", name="bot", api_base_url="http://127.0.0.1:9/tg/")
    assert isinstance(provider_for("tienda", bot), TelegramProvider) and "127.0.0.1:9/tg" in repr(
        provider_for("tienda", bot)
    )
    bare = services.channel_config_set("tienda", kind="telegram", name="bare")
    assert isinstance(provider_for("tienda", bare), ConsoleProvider)
    assert isinstance(provider_for("tienda", None), ConsoleProvider)
    settings.CONFIG = dataclasses.replace(settings.CONFIG, profile="production", debug=False)
    assert isinstance(provider_for("tienda", bare), UnconfiguredProvider)
    with pytest.raises(ValueError):
        provider_for("otra", main)


def test_secret_hash_format() -> None:
    stored = credentials.secret_hash("abc")
    assert stored.startswith("sha256$") and credentials.secret_matches("abc", stored)
    assert not credentials.secret_matches("abc", "md5$x$y") and not credentials.secret_matches("", stored)


def test_rotate_command_and_unreadable_credential_in_a_webhook(configured, settings, client) -> None:
    from io import StringIO

    from django.core.management import call_command

    from botmesh_admin.events import connect_journal, use_journal

    out = StringIO()
    call_command("botmesh_channels_rotate", stdout=out)
    assert "re-encrypted 3 channel secrets" in out.getvalue()
    settings.SECRET_KEY = "another-secret-key-and-no-credentials-keys-0123456789"  # the key is lost
    with use_journal(connect_journal("memory://")) as journal:
        resp = client.post(
            "/webhooks/whatsapp/tienda", b"{}", content_type="application/json", HTTP_X_HUB_SIGNATURE_256="sha256=00"
        )
        assert (resp.status_code, resp.json()["error"]) == (503, "credential_unreadable")
        assert journal.list(tenant="tienda") == []


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254",
        "https://169.254.169.254/latest/meta-data",
        "https://localhost:8731",
        "https://127.0.0.1/",
        "https://2130706433/",
        "https://[::1]/",
        "https://[::ffff:127.0.0.1]/",
        "https://10.0.0.5/",
        "https://192.168.1.1/",
        "https://100.64.0.1/",
        "https://0.0.0.0/",
        "http://graph.facebook.com/v21.0",
    ],
)
def test_api_base_url_to_the_servers_own_network_is_refused_in_production(configured, settings, url) -> None:
    """Found by exploratory testing: a channel could send its credentials to 169.254.169.254 or localhost (SSRF)."""
    settings.CONFIG = dataclasses.replace(settings.CONFIG, profile="production", debug=False)
    before = raw_rows()
    with pytest.raises(ValidationError) as info:
        services.channel_config_set("tienda", kind="telegram", name="bot", api_base_url=url)
    assert info.value.field == "channel.api_base_url"
    assert raw_rows() == before


def test_api_base_url_to_a_public_https_host_is_kept_in_production(configured, settings) -> None:
    """Found by exploratory testing (the SSRF rule must still allow the real APIs and proxies)."""
    settings.CONFIG = dataclasses.replace(settings.CONFIG, profile="production", debug=False)
    channel = services.channel_config_set("tienda", kind="telegram", name="bot", api_base_url="https://tg.example.com/")
    assert channel.api_base_url == "https://tg.example.com"


def test_dev_profile_allows_http_only_to_this_machine(configured) -> None:
    """Found by exploratory testing: dev keeps a local fake provider working, nothing else over plain http,
    and no private or link-local address even over https."""
    for url in ("http://127.0.0.1:8731/fake", "http://localhost:8731", "http://[::1]:8731"):
        assert services.channel_config_set("tienda", kind="telegram", name="bot", api_base_url=url).api_base_url == url
    for url in (
        "http://169.254.169.254",
        "http://10.0.0.5",
        "http://api.telegram.org",
        "https://169.254.169.254/latest",
        "https://10.0.0.5/x",
        "https://[fe80::1]/x",
        "https://192.168.0.10/",
    ):
        with pytest.raises(ValidationError) as info:
            services.channel_config_set("tienda", kind="telegram", name="bot", api_base_url=url)
        assert info.value.field == "channel.api_base_url"


def test_api_answers_422_naming_api_base_url_for_a_metadata_address(configured, settings) -> None:
    """Found by exploratory testing: PUT channels/<name> accepted http://169.254.169.254."""
    from django.test import Client

    from botmesh_admin.tenancy.services import token_create

    settings.CONFIG = dataclasses.replace(settings.CONFIG, profile="production", debug=False)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token_create('tienda', name='ci')[1]}")
    response = client.put(
        "/api/v1/tenants/tienda/channels/bot",
        {"kind": "telegram", "api_base_url": "http://169.254.169.254"},
        content_type="application/json",
    )
    assert response.status_code == 422 and response.json()["field"] == "channel.api_base_url"
