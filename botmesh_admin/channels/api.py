"""``/api/v1/tenants/{tenant}/channels`` — channel configuration (admins only).

Secrets are write-only: answers say which are set (``secrets: {"app_secret": true, …}``), never their values.
"""

from __future__ import annotations

from django.http import HttpRequest
from django.urls import reverse
from ninja import Router, Schema, Status

from botmesh_admin.api import BodyIn, ErrorOut, one_of, requires

from . import selectors, services
from .domain import CHANNEL_KINDS, Channel

router = Router(tags=["channels"])


class ChannelIn(BodyIn):
    """Create or update a channel. Omitted (or empty) secrets keep their stored value."""

    kind: str = one_of(CHANNEL_KINDS)
    phone_number_id: str | None = None
    display_phone_number: str | None = None
    bot_username: str | None = None
    api_base_url: str | None = None
    app_secret: str | None = None
    verify_token: str | None = None
    access_token: str | None = None
    bot_token: str | None = None
    webhook_secret: str | None = None
    clear: list[str] = []


class ChannelOut(Schema):
    kind: str
    name: str
    phone_number_id: str | None
    display_phone_number: str | None
    bot_username: str | None
    api_base_url: str | None
    secrets: dict[str, bool]
    webhook_path: str


def _out(channel: Channel) -> ChannelOut:
    if channel.kind == "whatsapp":
        path = reverse("webhooks:whatsapp", kwargs={"tenant": channel.tenant})
    else:
        path = reverse("webhooks:telegram", kwargs={"tenant": channel.tenant, "name": channel.name})
    return ChannelOut(
        kind=channel.kind,
        name=channel.name,
        phone_number_id=channel.phone_number_id,
        display_phone_number=channel.display_phone_number,
        bot_username=channel.bot_username,
        api_base_url=channel.api_base_url,
        secrets=channel.secrets_set,
        webhook_path=path,
    )


@router.get("channels", response={200: list[ChannelOut], 403: ErrorOut})
@requires("admin")
def channel_list(request: HttpRequest, tenant: str) -> list[ChannelOut]:
    """List the tenant's channels."""
    return [_out(c) for c in selectors.channel_config_list(tenant)]


@router.get("channels/{name}", response={200: ChannelOut, 403: ErrorOut, 404: ErrorOut})
@requires("admin")
def channel_get(request: HttpRequest, tenant: str, name: str) -> ChannelOut:
    """Return one channel."""
    return _out(selectors.channel_config_get(tenant, name=name))


@router.put("channels/{name}", response={200: ChannelOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut, 422: ErrorOut})
@requires("admin")
def channel_put(request: HttpRequest, tenant: str, name: str, body: ChannelIn) -> ChannelOut:
    """Create or update the channel ``name`` (secrets are stored encrypted or hashed)."""
    data = body.model_dump()
    clear = tuple(data.pop("clear"))
    return _out(services.channel_config_set(tenant, name=name, clear=clear, **data))


@router.delete("channels/{name}", response={204: None, 403: ErrorOut, 404: ErrorOut})
@requires("admin")
def channel_delete(request: HttpRequest, tenant: str, name: str) -> Status[None]:
    """Delete the channel ``name``."""
    services.channel_config_delete(tenant, name=name)
    return Status(204, None)
