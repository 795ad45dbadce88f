"""botmesh kernel: channels (inbound webhooks, outbound providers, per-tenant channel configuration)."""

from django.apps import AppConfig


class ChannelsConfig(AppConfig):
    name = "botmesh_admin.channels"
    label = "channels"
    nav: list[tuple[str, str, str]] = [("Channels", "channels:list", "admin")]
