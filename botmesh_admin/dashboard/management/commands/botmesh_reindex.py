"""``manage.py botmesh_reindex [--tenant T] [--index NAME] [--rebuild]``: build indexes online.

Walks every tenant and every indexed collection the packages declare
(``botmesh_admin.kv.indexes.declare``) and builds each index that is not built
yet, with progress. Safe while the admin runs (writers keep the index while it
builds) and resumable: a killed run continues where it stopped.
"""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from botmesh_admin.kv import TenantKv
from botmesh_admin.kv.indexes import declared
from botmesh_admin.kv.runtime import default_kv


def tenant_ids(only: str | None) -> list[str]:
    """Return the ids of the tenants to walk (``only`` must exist)."""
    from botmesh_admin.tenancy.models import Tenant

    ids = sorted(Tenant.objects.values_list("id", flat=True))
    if only is not None:
        if only not in ids:
            raise CommandError(f"--tenant: no tenant {only!r}")
        return [only]
    return ids


def index_names(only: str | None) -> set[str] | None:
    """Return the index names to walk (``None``: all); an unknown ``only`` is an error."""
    if only is None:
        return None
    known = {i.name for c in declared() for r in c.records for i in r.indexes}
    if only not in known:
        raise CommandError(f"--index: no index {only!r}; known: {', '.join(sorted(known))}")
    return {only}


def unbuilt(tenants: list[str]) -> list[tuple[str, str, str]]:
    """Return ``(tenant, table, index)`` for each declared index not built in a table with records."""
    kv = default_kv()
    out = []
    for tenant in tenants:
        for collection in declared():
            layout = collection.layout(kv)
            for instance in collection.collections(kv, tenant):
                table = TenantKv(kv, collection.package).table(tenant, instance)
                for name in layout.index_names():
                    if layout.state(table, name) != "built":
                        record = next(r for r in collection.records if any(i.name == name for i in r.indexes))
                        if kv.scan(table, prefix=record.prefix, limit=1):
                            out.append((tenant, table, name))
    return out


class Command(BaseCommand):
    help = "Build the Kv's secondary indexes over existing records (online, resumable)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--tenant", help="only this tenant")
        parser.add_argument("--index", help="only this index")
        parser.add_argument("--rebuild", action="store_true", help="clear and build again")
        parser.add_argument("--batch", type=int, default=500, help="records per commit")

    def handle(self, *args: Any, **options: Any) -> None:
        if not 1 <= options["batch"] <= 5000:
            raise CommandError("--batch: must be 1..5000")
        kv = default_kv()
        only = index_names(options["index"])
        built = 0
        for tenant in tenant_ids(options["tenant"]):
            for collection in declared():
                layout = collection.layout(kv)
                for instance in collection.collections(kv, tenant):
                    table = TenantKv(kv, collection.package).table(tenant, instance)
                    for name in layout.index_names():
                        if only is not None and name not in only:
                            continue
                        if layout.state(table, name) == "built" and not options["rebuild"]:
                            continue
                        label = f"{tenant} {collection.package}/{instance} {name}"

                        def show(done: int, label: str = label) -> None:
                            sys.stdout.write(f"\r  {label}: {done} records")
                            sys.stdout.flush()

                        done = layout.build(
                            table, name, batch=options["batch"], rebuild=options["rebuild"], progress=show
                        )
                        self.stdout.write(f"\r  {label}: {done} records indexed, built")
                        built += 1
        self.stdout.write(f"botmesh_reindex: {built} index(es) built")
