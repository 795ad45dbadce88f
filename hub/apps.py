from django.apps import AppConfig


class HubConfig(AppConfig):
    name = "hub"
    verbose_name = "hub"
    nav: list[tuple[str, str, str]] = [("Plugins", "hub:plugins", "admin")]
