from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    name = "botmesh_admin.observability"
    label = "observability"
    verbose_name = "Observability"
    nav: list[tuple[str, str, str]] = []
