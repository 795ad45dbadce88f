"""Writes of channel configuration: validated, secrets encrypted or hashed before they are stored."""

from __future__ import annotations

import ipaddress
import re
import socket
from urllib.parse import urlsplit

from django.conf import settings
from django.db import IntegrityError, transaction

from botmesh_admin.errors import BadType, Conflict, NotFound, ValidationError
from botmesh_admin.kv.tenant import validate_id
from botmesh_admin.tenancy.models import Tenant

from .. import credentials
from ..domain import (
    CHANNEL_KINDS,
    ENCRYPTED_SECRETS,
    PUBLIC_OF_KIND,
    SECRETS_OF_KIND,
    Channel,
)
from ..models import ChannelConfig
from ..providers import ip_address_of, is_public
from ..selectors import channel_config_forget, to_channel
from ..telegram import SECRET_TOKEN_RE

PHONE_NUMBER_ID_RE = re.compile(r"^[0-9]{1,32}$")
DISPLAY_NUMBER_RE = re.compile(r"^\+?[0-9][0-9 ()-]{2,31}$")
BOT_USERNAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{3,63}$")
BOT_TOKEN_RE = re.compile(r"^[0-9]{1,20}:[A-Za-z0-9_-]{20,100}$")
PRINTABLE_SECRET_RE = re.compile(r"^[\x21-\x7e]{1,512}$")  # visible ASCII, no spaces


def _validate_public(value: str, field: str) -> str:
    value = value.strip()
    if not value:
        return ""
    if field == "phone_number_id" and not PHONE_NUMBER_ID_RE.fullmatch(value):
        raise ValidationError("channel.phone_number_id", "must be the numeric phone number id Meta shows")
    if field == "display_phone_number" and not DISPLAY_NUMBER_RE.fullmatch(value):
        raise ValidationError("channel.display_phone_number", "not a phone number")
    if field == "bot_username":
        value = value.removeprefix("@")
        if not BOT_USERNAME_RE.fullmatch(value):
            raise ValidationError("channel.bot_username", "must be 4-64 letters, digits or _")
    return value


def validate_api_base_url(value: str, *, production: bool) -> str:
    """Return the provider API base URL ``value`` without its trailing ``/`` (``""``: the default API).

    The server sends requests (with the channel's credentials) to this URL, so
    it must not reach the server's own network (SSRF): in production it must be
    https to a host that is not a loopback, link-local (cloud metadata at
    169.254.169.254), private or otherwise non-public address. The dev profile
    also allows this machine, over http too (a local fake provider), and no
    other non-public address. A host
    name is checked here as written (``localhost``), not resolved; in production
    the providers check the address each connection reaches (``public_only`` in
    ``providers``), which also covers a name that resolves differently later.
    Raise ``ValidationError`` naming ``channel.api_base_url``.
    """
    field = "channel.api_base_url"
    value = value.strip()
    if not value:
        return ""
    if len(value) > 200:
        raise ValidationError(field, "longer than 200 characters")
    try:
        parts = urlsplit(value)
        host = (parts.hostname or "").rstrip(".").lower()
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        raise ValidationError(field, "not a URL") from None
    if parts.scheme not in ("http", "https") or not host:
        raise ValidationError(field, "must be an http(s) URL")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ValidationError(field, "must not carry a query, fragment or credentials")
    address = _ip_literal(host)
    loopback = address.is_loopback if address else host == "localhost" or host.endswith(".localhost")
    if production:
        if parts.scheme != "https":
            raise ValidationError(field, "must be an https URL in production")
        if loopback or (address is not None and not is_public(address)):
            raise ValidationError(field, "must not point at a loopback, link-local or private address")
    elif parts.scheme == "http" and not loopback:
        raise ValidationError(field, "http is for a provider on this machine (localhost) only; use https")
    elif address is not None and not loopback and not is_public(address):
        raise ValidationError(
            field, "must not point at a private or link-local address (only this machine, for a local fake provider)"
        )
    return value.rstrip("/")


def _ip_literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """Return the address ``host`` spells (any form the resolver accepts: ``2130706433``, ``0x7f.1``), or None."""
    try:
        info = socket.getaddrinfo(host, None, flags=socket.AI_NUMERICHOST)  # parses only, never asks DNS
    except (socket.gaierror, UnicodeError, ValueError):
        return None
    return ip_address_of(str(info[0][4][0]))  # ::ffff:127.0.0.1 is 127.0.0.1


def _validate_secret(value: str, field: str) -> str:
    if field == "bot_token" and not BOT_TOKEN_RE.fullmatch(value):
        raise ValidationError("channel.bot_token", "must look like 123456789:AAE… (as BotFather gives it)")
    if field == "webhook_secret" and not SECRET_TOKEN_RE.fullmatch(value):
        raise ValidationError("channel.webhook_secret", "must be 1-256 characters of A-Z a-z 0-9 _ -")
    if not PRINTABLE_SECRET_RE.fullmatch(value):
        raise ValidationError(f"channel.{field}", "must be 1-512 visible ASCII characters")
    return value


def channel_config_set(
    tenant: str,
    *,
    kind: str,
    name: str,
    phone_number_id: str | None = None,
    display_phone_number: str | None = None,
    bot_username: str | None = None,
    api_base_url: str | None = None,
    app_secret: str | None = None,
    verify_token: str | None = None,
    access_token: str | None = None,
    bot_token: str | None = None,
    webhook_secret: str | None = None,
    clear: tuple[str, ...] = (),
) -> Channel:
    """Create or update the channel ``name`` of ``tenant``; return it.

    Public fields: ``None`` keeps the stored value, ``""`` clears it. Secrets:
    ``None`` or ``""`` keeps the stored value (a form never shows it back); name
    a secret in ``clear`` to remove it. ``app_secret``, ``access_token`` and
    ``bot_token`` are stored encrypted; ``verify_token`` and ``webhook_secret``
    hashed. A WhatsApp channel needs ``phone_number_id``, unique in the tenant.

    Raise ``NotFound`` for an unknown tenant, ``ValidationError`` naming the field
    (``channel.bot_token: …``) for a bad value, a field of the other kind or a
    change of kind, and ``Conflict`` if a concurrent write took the name or number.
    """
    if not isinstance(kind, str):
        raise BadType("channel.kind", "must be a string")
    if kind not in CHANNEL_KINDS:
        raise ValidationError("channel.kind", f"must be one of {', '.join(CHANNEL_KINDS)}")
    validate_id(name, "channel.name")
    public_in = {
        "phone_number_id": phone_number_id,
        "display_phone_number": display_phone_number,
        "bot_username": bot_username,
    }
    secrets_in = {
        "app_secret": app_secret,
        "verify_token": verify_token,
        "access_token": access_token,
        "bot_token": bot_token,
        "webhook_secret": webhook_secret,
    }
    for field, value in (*public_in.items(), *secrets_in.items(), ("api_base_url", api_base_url)):
        if value is not None and not isinstance(value, str):
            raise BadType(f"channel.{field}", "must be a string")
    for field, value in (*public_in.items(), *secrets_in.items()):
        allowed = PUBLIC_OF_KIND[kind] + SECRETS_OF_KIND[kind]
        if value and field not in allowed:
            raise ValidationError(f"channel.{field}", f"not used by {kind} channels")
    for field in clear:
        if field not in SECRETS_OF_KIND[kind]:
            raise ValidationError("channel.clear", f"{field!r} is not a secret of {kind} channels")
    public = {f: _validate_public(v, f) for f, v in public_in.items() if v is not None}
    production = settings.CONFIG.production
    base_url = validate_api_base_url(api_base_url, production=production) if api_base_url is not None else None
    secrets = {f: _validate_secret(v, f) for f, v in secrets_in.items() if v}

    if not Tenant.objects.filter(id=tenant).exists():
        raise NotFound(f"tenant {tenant!r} not found")
    try:
        with transaction.atomic():
            row = ChannelConfig.objects.select_for_update().filter(tenant_id=tenant, name=name).first()
            if row is None:
                row = ChannelConfig(tenant_id=tenant, kind=kind, name=name)
            elif row.kind != kind:
                raise ValidationError("channel.kind", f"channel {name!r} is a {row.kind} channel")
            for field, value in public.items():
                setattr(row, field, value)
            if base_url is not None:
                row.api_base_url = base_url
            for field in clear:
                setattr(row, _column(field), "")
            for field, value in secrets.items():
                sealed = credentials.encrypt(value) if field in ENCRYPTED_SECRETS else credentials.secret_hash(value)
                setattr(row, _column(field), sealed)
            if kind == "whatsapp":
                _validate_whatsapp_number(row)
            row.save()
    except IntegrityError:
        raise Conflict(f"channel {name!r} or its phone number id was just taken by another write") from None
    _forget(tenant)
    return to_channel(row)


def _forget(tenant: str | None) -> None:
    """Drop the webhooks' cached configuration now and, inside a transaction, again once it commits.

    The second drop covers a webhook that re-read the old rows in between.
    """
    channel_config_forget(tenant)
    transaction.on_commit(lambda: channel_config_forget(tenant))


def _column(secret: str) -> str:
    return f"{secret}_encrypted" if secret in ENCRYPTED_SECRETS else f"{secret}_hash"


def _validate_whatsapp_number(row: ChannelConfig) -> None:
    if not row.phone_number_id:
        raise ValidationError("channel.phone_number_id", "required for a WhatsApp channel")
    other = (
        ChannelConfig.objects.filter(tenant_id=row.tenant_id, kind="whatsapp", phone_number_id=row.phone_number_id)
        .exclude(pk=row.pk)
        .values_list("name", flat=True)
        .first()
    )
    if other is not None:
        raise ValidationError("channel.phone_number_id", f"already used by channel {other!r}")


def channel_config_delete(tenant: str, *, name: str) -> None:
    """Delete the channel ``name`` of ``tenant``; raise ``NotFound`` if there is none."""
    deleted, _ = ChannelConfig.objects.filter(tenant_id=tenant, name=name).delete()
    if not deleted:
        raise NotFound(f"channel {name!r} not found")
    _forget(tenant)


def channel_credentials_rotate() -> int:
    """Re-encrypt every stored channel secret with the newest key; return how many values changed.

    Run after putting a new key first in ``BOTMESH_CREDENTIALS_KEYS``; once it has
    run, the old key may be removed. Raise ``CredentialUnreadable`` if a value
    cannot be decrypted with any configured key (nothing is written then).
    """
    columns = [_column(s) for s in ENCRYPTED_SECRETS]
    changed = 0
    with transaction.atomic():
        for row in ChannelConfig.objects.select_for_update().order_by("pk"):
            for column in columns:
                token = getattr(row, column)
                if token:
                    setattr(row, column, credentials.reencrypt(token))
                    changed += 1
            row.save(update_fields=[*columns, "updated_at"])
    _forget(None)
    return changed
