"""botmesh kernel: dashboard (replicas and scheduled jobs pages)."""
from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "botmesh_admin.dashboard"
    label = "dashboard"
    nav: list[tuple[str, str, str]] = [
        ("Replicas", "dashboard:replicas", "agent"),
        ("Jobs", "dashboard:jobs", "admin"),
    ]
