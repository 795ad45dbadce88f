from django.apps import AppConfig


class ChannelsConfig(AppConfig):
    name = "botmesh_admin.channels"
    label = "channels"
    nav: list[tuple[str, str, str]] = []
