"""The inbox package (ARCHITECTURE §5)."""

from django.apps import AppConfig


class InboxConfig(AppConfig):
    name = "inbox"
    verbose_name = "inbox"
    nav: list[tuple[str, str, str]] = [("Inbox", "inbox:list", "agent")]

    def ready(self) -> None:
        from . import handlers  # noqa: F401 - registers the journal consumers
