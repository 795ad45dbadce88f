from django.apps import AppConfig


class InboxConfig(AppConfig):
    name = "inbox"
    verbose_name = "inbox"
    nav: list[tuple[str, str, str]] = []
