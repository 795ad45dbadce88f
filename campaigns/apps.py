from django.apps import AppConfig


class CampaignsConfig(AppConfig):
    name = "campaigns"
    verbose_name = "campaigns"
    nav: list[tuple[str, str, str]] = [("Campaigns", "campaigns:list", "admin")]
