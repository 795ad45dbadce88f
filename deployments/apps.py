from django.apps import AppConfig


class DeploymentsConfig(AppConfig):
    name = "deployments"
    verbose_name = "deployments"
    nav: list[tuple[str, str, str]] = [("Deployments", "deployments:bots", "admin")]
