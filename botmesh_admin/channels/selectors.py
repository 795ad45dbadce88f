"""Reads of channel configuration. A foreign tenant's channel is ``NotFound``, like a missing one."""

from __future__ import annotations

from botmesh_admin.errors import NotFound

from .domain import Channel
from .models import ChannelConfig


def to_channel(row: ChannelConfig) -> Channel:
    """Return the domain value of a ``ChannelConfig`` row (secrets stay sealed)."""
    sealed = {
        "app_secret": row.app_secret_encrypted,
        "access_token": row.access_token_encrypted,
        "bot_token": row.bot_token_encrypted,
        "verify_token": row.verify_token_hash,
        "webhook_secret": row.webhook_secret_hash,
    }
    return Channel(
        tenant=row.tenant_id,
        kind=row.kind,
        name=row.name,
        phone_number_id=row.phone_number_id or None,
        display_phone_number=row.display_phone_number or None,
        bot_username=row.bot_username or None,
        api_base_url=row.api_base_url or None,
        updated_at_ms=int(row.updated_at.timestamp() * 1000) if row.updated_at else 0,
        sealed={k: v for k, v in sealed.items() if v},
    )


def channel_config_list(tenant: str, *, kind: str | None = None) -> list[Channel]:
    """Return the tenant's channels ordered by name, optionally only those of ``kind``."""
    rows = ChannelConfig.objects.filter(tenant_id=tenant)
    if kind is not None:
        rows = rows.filter(kind=kind)
    return [to_channel(r) for r in rows.order_by("name")]


def channel_config_get(tenant: str, *, name: str) -> Channel:
    """Return the tenant's channel called ``name``; raise ``NotFound`` if there is none."""
    row = ChannelConfig.objects.filter(tenant_id=tenant, name=name).first()
    if row is None:
        raise NotFound(f"channel {name!r} not found")
    return to_channel(row)


def channel_for_whatsapp(tenant: str, *, phone_number_id: str) -> Channel:
    """Return the WhatsApp channel of ``tenant`` for the webhook's ``metadata.phone_number_id``.

    Raise ``NotFound`` if the tenant has no WhatsApp channel with that number.
    """
    row = ChannelConfig.objects.filter(
        tenant_id=tenant, kind="whatsapp", phone_number_id=phone_number_id
    ).first()
    if row is None:
        raise NotFound("no WhatsApp channel for this phone number id")
    return to_channel(row)


def channel_for_telegram(tenant: str, *, name: str) -> Channel:
    """Return the Telegram channel ``name`` of ``tenant`` (the webhook URL names both).

    Raise ``NotFound`` if there is none, or if ``name`` is not a Telegram channel.
    """
    row = ChannelConfig.objects.filter(tenant_id=tenant, kind="telegram", name=name).first()
    if row is None:
        raise NotFound(f"Telegram channel {name!r} not found")
    return to_channel(row)
