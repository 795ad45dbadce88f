from django.apps import AppConfig


class TenancyConfig(AppConfig):
    name = "botmesh_admin.tenancy"
    label = "tenancy"
    verbose_name = "Tenancy"
    nav = [("Settings", "tenancy:tokens", "admin")]

    def ready(self) -> None:
        from botmesh_admin.celery import app  # noqa: F401  (bind shared_task to our app)
