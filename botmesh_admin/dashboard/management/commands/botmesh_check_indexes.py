"""``manage.py botmesh_check_indexes [--tenant T] [--index NAME] [--repair]``: verify indexes.

Recomputes every declared index of every tenant from its records and compares
(a full scan: run it off-peak). A drifting index is checked a second time before
it is reported, to tell drift from a write that happened during the first pass;
``--repair`` rebuilds what still drifts (online). Exits 1 if drift remains.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from botmesh_admin.kv import TenantKv
from botmesh_admin.kv.indexes import declared
from botmesh_admin.kv.runtime import default_kv

from .botmesh_reindex import index_names, tenant_ids


class Command(BaseCommand):
    help = "Compare the Kv's secondary indexes with their records; --repair rebuilds drifting ones."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--tenant", help="only this tenant")
        parser.add_argument("--index", help="only this index")
        parser.add_argument("--repair", action="store_true", help="rebuild drifting indexes")

    def handle(self, *args: Any, **options: Any) -> None:
        kv = default_kv()
        only = index_names(options["index"])
        checked = drifting = 0
        for tenant in tenant_ids(options["tenant"]):
            for collection in declared():
                layout = collection.layout(kv)
                for instance in collection.collections(kv, tenant):
                    table = TenantKv(kv, collection.package).table(tenant, instance)
                    for name in layout.index_names():
                        if only is not None and name not in only:
                            continue
                        if layout.state(table, name) != "built":
                            continue  # botmesh_reindex's job; reads refuse it meanwhile
                        checked += 1
                        report = layout.check(table, name)
                        if any(report.values()):
                            report = layout.check(table, name)
                        if not any(report.values()):
                            continue
                        label = f"{tenant} {collection.package}/{instance} {name}"
                        detail = ", ".join(f"{v} {k}" for k, v in report.items() if v)
                        if options["repair"]:
                            layout.build(table, name, rebuild=True)
                            self.stdout.write(f"  {label}: drift ({detail}); rebuilt")
                        else:
                            drifting += 1
                            self.stdout.write(f"  {label}: drift ({detail})")
        self.stdout.write(f"botmesh_check_indexes: {checked} checked, {drifting} drifting")
        if drifting:
            raise CommandError(f"{drifting} index(es) drift; run with --repair")
