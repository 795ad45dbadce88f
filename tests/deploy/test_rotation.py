"""Key rotation as the README describes it: old sessions and old encrypted values keep working.

SECRET_KEY: the new key goes in ``SECRET_KEY``, the old one in ``SECRET_KEY_FALLBACKS``
(``BOTMESH_HASH_KEY`` pinned first). Channel credentials: a new key goes first in
``BOTMESH_CREDENTIALS_KEYS``, ``manage.py botmesh_channels_rotate`` re-encrypts, then
the old key may go.
"""

from __future__ import annotations

import dataclasses

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import signing
from django.core.management import call_command
from django.test import Client, override_settings

from botmesh_admin import config
from botmesh_admin.channels import credentials
from botmesh_admin.channels.selectors import channel_config_get
from botmesh_admin.channels.services import channel_config_set
from botmesh_admin.tenancy import services as tenancy

OLD_KEY = "old-secret-key-" + "o" * 40
NEW_KEY = "new-secret-key-" + "n" * 40
BOT_TOKEN = "123456:" + "B" * 35


def keys(*credentials_keys: str, secret: str = OLD_KEY, fallbacks: tuple[str, ...] = ()) -> override_settings:
    """Settings with these keys (``CONFIG`` is what the credentials keyring reads)."""
    cfg = dataclasses.replace(settings.CONFIG, credentials_keys=list(credentials_keys), secret_key=secret)
    return override_settings(CONFIG=cfg, SECRET_KEY=secret, SECRET_KEY_FALLBACKS=list(fallbacks))


@pytest.fixture
def member(db) -> Client:
    get_user_model().objects.create_user("ada", password="ada-password-1")
    tenancy.tenant_create("acme", name="ACME")
    tenancy.membership_set("acme", username="ada", role="admin")
    return Client()


def test_sessions_survive_a_secret_key_rotation_with_the_old_key_as_fallback(member: Client) -> None:
    other = Client()
    with keys(secret=OLD_KEY):
        assert member.login(username="ada", password="ada-password-1")
        assert other.login(username="ada", password="ada-password-1")
        assert member.get("/t/acme/").status_code == 200
    with keys(secret=NEW_KEY, fallbacks=(OLD_KEY,)):
        assert member.get("/t/acme/").status_code == 200  # still logged in (Django re-signs it)
    with keys(secret=NEW_KEY):
        assert member.get("/t/acme/").status_code == 200  # re-signed with the new key above
        assert other.get("/t/acme/").status_code == 302  # never seen during the overlap: log in again


def test_signed_values_verify_after_rotation_only_while_the_old_key_is_a_fallback() -> None:
    with keys(secret=OLD_KEY):
        token = signing.dumps({"user": 1})
    with keys(secret=NEW_KEY, fallbacks=(OLD_KEY,)):
        assert signing.loads(token) == {"user": 1}
    with keys(secret=NEW_KEY), pytest.raises(signing.BadSignature):
        signing.loads(token)


def test_channel_credentials_encrypted_under_the_old_secret_key_stay_readable(db) -> None:
    """Without BOTMESH_CREDENTIALS_KEYS the key derives from SECRET_KEY; its fallbacks derive too."""
    tenancy.tenant_create("acme", name="ACME")
    with keys(secret=OLD_KEY):
        channel_config_set("acme", kind="telegram", name="main", bot_token=BOT_TOKEN)
    with keys(secret=NEW_KEY, fallbacks=(OLD_KEY,)):
        assert channel_config_get("acme", name="main").secret("bot_token") == BOT_TOKEN
        call_command("botmesh_channels_rotate")  # re-encrypted under the new key
    with keys(secret=NEW_KEY):
        assert channel_config_get("acme", name="main").secret("bot_token") == BOT_TOKEN


def test_credentials_key_rotation_keeps_old_values_then_reencrypts_them(db) -> None:
    tenancy.tenant_create("acme", name="ACME")
    with keys("key-one"):
        channel_config_set("acme", kind="telegram", name="main", bot_token=BOT_TOKEN)
        sealed_before = channel_config_get("acme", name="main").sealed["bot_token"]
    with keys("key-two", "key-one"):  # the new key first, the old one still listed
        assert channel_config_get("acme", name="main").secret("bot_token") == BOT_TOKEN
        call_command("botmesh_channels_rotate")
    with keys("key-two"):  # the old key removed
        channel = channel_config_get("acme", name="main")
        assert channel.sealed["bot_token"] != sealed_before
        assert channel.secret("bot_token") == BOT_TOKEN
        with pytest.raises(credentials.CredentialUnreadable):
            credentials.decrypt(sealed_before)


def test_rotating_the_secret_key_requires_a_pinned_hash_key() -> None:
    """The id hash key defaults to SECRET_KEY; rotating without pinning it would change every hash."""
    with pytest.raises(config.ConfigError, match="^SECRET_KEY_FALLBACKS: set BOTMESH_HASH_KEY"):
        config.load({"SECRET_KEY": NEW_KEY, "SECRET_KEY_FALLBACKS": OLD_KEY})
    cfg = config.load({"SECRET_KEY": NEW_KEY, "SECRET_KEY_FALLBACKS": f"{OLD_KEY}, older",
                       "BOTMESH_HASH_KEY": OLD_KEY})  # fmt: skip
    assert cfg.secret_key_fallbacks == (OLD_KEY, "older") and cfg.hash_key == OLD_KEY
