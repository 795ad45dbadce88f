"""``manage.py botmesh_check_indexes [--tenant T] [--index NAME] [--repair]``: verify indexes.

Recomputes every declared index of every tenant from its records and compares
(a full scan: run it off-peak). A drifting index is checked a second time before
it is reported, to tell drift from a write that happened during the first pass;
``--repair`` rebuilds what still drifts (online). Exits 1 if drift remains.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from botmesh_admin.kv.indexes import declared
from botmesh_admin.kv.runtime import default_kv

from .botmesh_reindex import index_names, targets, tenant_ids


class Command(BaseCommand):
    help = "Compare the Kv's secondary indexes with their records; --repair rebuilds drifting ones."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--tenant", help="only this tenant")
        parser.add_argument("--index", help="only this index")
        parser.add_argument("--repair", action="store_true", help="rebuild drifting indexes")

    def handle(self, *args: Any, **options: Any) -> None:
        checked = drifting = 0
        for t in targets(tenant_ids(options["tenant"]), index_names(options["index"])):
            if t.layout.state(t.table, t.index) != "built":
                continue  # botmesh_reindex's job; reads refuse it meanwhile
            checked += 1
            report = t.layout.check(t.table, t.index)
            if any(report.values()):  # again: a write during the first pass is no drift
                report = t.layout.check(t.table, t.index)
            if not any(report.values()):
                continue
            detail = ", ".join(f"{v} {k}" for k, v in report.items() if v)
            if options["repair"]:
                t.layout.build(t.table, t.index, rebuild=True)
                self.stdout.write(f"  {t.label}: drift ({detail}); rebuilt")
            else:
                drifting += 1
                self.stdout.write(f"  {t.label}: drift ({detail})")
        if options["index"] is None:
            more_checked, more_drifting = self._verify(tenant_ids(options["tenant"]), repair=options["repair"])
            checked += more_checked
            drifting += more_drifting
        self.stdout.write(f"botmesh_check_indexes: {checked} checked, {drifting} drifting")
        if drifting:
            raise CommandError(f"{drifting} index(es) drift; run with --repair")

    def _verify(self, tenants: list[str], *, repair: bool) -> tuple[int, int]:
        """Run the declared ``verify`` checks (derived data, e.g. segment membership); return (checked, drifting)."""
        kv = default_kv()
        checked = drifting = 0
        for tenant in tenants:
            for collection in declared():
                if collection.verify is None:
                    continue
                checked += 1
                label = f"{tenant} {collection.package}/{collection.collection} (derived)"
                report = dict(collection.verify(kv, tenant))
                if any(report.values()):  # again: a write during the first pass is no drift
                    report = dict(collection.verify(kv, tenant))
                if not any(report.values()):
                    continue
                detail = ", ".join(f"{v} {k}" for k, v in report.items() if v)
                if repair and collection.repair is not None:
                    collection.repair(kv, tenant)
                    self.stdout.write(f"  {label}: drift ({detail}); rebuilt")
                else:
                    drifting += 1
                    self.stdout.write(f"  {label}: drift ({detail})")
        return checked, drifting
