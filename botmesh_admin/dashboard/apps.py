"""botmesh kernel: dashboard (replicas and scheduled jobs pages) and the operator commands."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig


def tell_about_unbuilt_indexes(sender: AppConfig, verbosity: int = 1, **kwargs: Any) -> None:
    """After ``migrate``: name the one command to run if a declared Kv index is not built yet.

    Tables written before an index was declared (an installation upgraded from
    an earlier version) need ``manage.py botmesh_reindex``; until then the
    reads that use that index answer 503 naming the command.
    """
    from botmesh_admin.errors import StoreUnavailable

    from .management.commands.botmesh_reindex import tenant_ids, unbuilt

    try:
        missing = unbuilt(tenant_ids(None))
    except StoreUnavailable:
        return  # the Kv is not reachable from here; /readyz says so
    if missing and verbosity:
        tenants = sorted({t for t, _, _ in missing})
        print(
            f"botmesh: {len(missing)} Kv index(es) of {len(tenants)} tenant(s) are not built yet; "
            "run `python manage.py botmesh_reindex` (online, resumable; `./dev run` does it itself)"
        )


class DashboardConfig(AppConfig):
    name = "botmesh_admin.dashboard"
    label = "dashboard"
    nav: list[tuple[str, str, str]] = [
        ("Replicas", "dashboard:replicas", "agent"),
        ("Jobs", "dashboard:jobs", "admin"),
    ]

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        post_migrate.connect(tell_about_unbuilt_indexes, sender=self)
