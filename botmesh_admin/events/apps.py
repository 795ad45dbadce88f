"""botmesh kernel: events (the journal, its worker, its pages)."""

from django.apps import AppConfig


class EventsConfig(AppConfig):
    name = "botmesh_admin.events"
    label = "events"
    nav: list[tuple[str, str, str]] = [("Journal", "events:list", "admin")]

    def ready(self) -> None:
        from botmesh_admin.observability.health import register_check

        from . import demo  # noqa: F401 - registers the demo fault's handler
        from .runtime import default_journal

        # /readyz answers 503 while the journal cannot be reached (ARCHITECTURE §10).
        register_check("journal", lambda: default_journal().ping())
