from django.apps import AppConfig


class EventsConfig(AppConfig):
    name = "botmesh_admin.events"
    label = "events"
    nav: list[tuple[str, str, str]] = []
