"""Reads of channel configuration. A foreign tenant's channel is ``NotFound``, like a missing one."""

from __future__ import annotations

import threading
import time

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


# Webhooks read the configuration on every POST; a per-process copy spares that
# query. Seconds: how long another process's change may go unseen here (this
# process's own changes drop the copy at once, see ``channel_config_forget``).
CONFIG_TTL_S = 10.0
_cache_lock = threading.Lock()
_cache: dict[str, tuple[float, tuple[Channel, ...]]] = {}
_generation = 0  # bumped by every forget: a read that overlapped a change is not kept


def channel_config_list_cached(tenant: str, *, kind: str | None = None, refresh: bool = False) -> list[Channel]:
    """Return ``channel_config_list(tenant, kind=kind)`` from a copy at most ``CONFIG_TTL_S`` old.

    For the webhook views only: a caller that would refuse a request because of
    the copy (a secret or a channel added or rotated in another process) asks
    again with ``refresh=True``, which reads the database and renews the copy.
    A tenant without channels is never kept, so unknown tenant ids in URLs
    cannot grow the cache.
    """
    now = time.monotonic()
    with _cache_lock:
        cached = None if refresh else _cache.get(tenant)
        generation = _generation
    if cached is not None and cached[0] > now:
        channels = cached[1]
    else:
        channels = tuple(channel_config_list(tenant))
        with _cache_lock:
            if channels and generation == _generation:
                _cache[tenant] = (now + CONFIG_TTL_S, channels)
            else:
                _cache.pop(tenant, None)
    return [c for c in channels if kind is None or c.kind == kind]


def channel_config_forget(tenant: str | None = None) -> None:
    """Drop the cached configuration of ``tenant`` (``None``: of every tenant) after a change."""
    global _generation
    with _cache_lock:
        _generation += 1
        if tenant is None:
            _cache.clear()
        else:
            _cache.pop(tenant, None)


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
    row = ChannelConfig.objects.filter(tenant_id=tenant, kind="whatsapp", phone_number_id=phone_number_id).first()
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
