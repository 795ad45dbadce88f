"""``manage.py botmesh_upgrade``: move kernel data an earlier version kept where a tenant id could name it.

Today: the campaigns' cross-tenant due-index, from ``campaigns/system/index`` to
``campaigns/~system/index`` (``botmesh_admin/kv/tenant.py`` states the rule).
Idempotent and resumable; safe while the admin runs (the scheduler's tick moves
what it finds too, so a rolling upgrade loses no scheduled campaign). It also
names any tenant whose id is now reserved (``system``, ``process``, ``kernel``):
the API and UI refuse it, and ``botmesh_tenant erase`` will not touch a kernel
namespace, so its rows and ``<package>/<id>/…`` tables must be moved or removed
by hand (a backup first).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from botmesh_admin.kv.runtime import default_kv
from botmesh_admin.kv.tenant import RESERVED_TENANT_IDS


class Command(BaseCommand):
    help = "Move kernel tables of earlier versions into the kernel namespaces (idempotent, resumable)."

    def handle(self, *args: Any, **options: Any) -> None:
        from botmesh_admin.tenancy.models import Tenant
        from campaigns.stores.kv import KvCampaignStore

        moved = KvCampaignStore(default_kv()).index_upgrade()
        if moved or options["verbosity"]:
            self.stdout.write(f"botmesh_upgrade: campaigns due-index: {moved} entries moved to campaigns/~system/index")
        for tenant in Tenant.objects.filter(id__in=sorted(RESERVED_TENANT_IDS)).values_list("id", flat=True):
            self.stderr.write(
                f"botmesh_upgrade: tenant {tenant!r} has a reserved id (the kernel's own namespace); "
                "the API and UI refuse it"
            )
