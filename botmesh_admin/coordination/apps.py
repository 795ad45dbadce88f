from django.apps import AppConfig


class CoordinationConfig(AppConfig):
    name = "botmesh_admin.coordination"
    label = "coordination"
    nav: list[tuple[str, str, str]] = []
