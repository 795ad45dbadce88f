from django.apps import AppConfig


class CrmConfig(AppConfig):
    name = "crm"
    verbose_name = "crm"
    nav: list[tuple[str, str, str]] = [
        ("Contacts", "crm:contacts", "agent"),
        ("Segments", "crm:segments", "agent"),
    ]
