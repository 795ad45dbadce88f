"""``manage.py botmesh_reindex [--tenant T] [--index NAME] [--rebuild]``: build indexes online.

Walks every tenant and every indexed collection the packages declare
(``botmesh_admin.kv.indexes.declare``) and builds each index that is not built
yet, with progress. Safe while the admin runs (writers keep the index while it
builds) and resumable: a killed run continues where it stopped.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from botmesh_admin.kv import TenantKv
from botmesh_admin.kv.indexes import IndexedTable, RecordType, declared
from botmesh_admin.kv.runtime import default_kv


def tenant_ids(only: str | None) -> list[str]:
    """Return the ids of the tenants to walk (``only`` must exist; reserved ids are left out)."""
    from botmesh_admin.tenancy import selectors

    ids = selectors.tenant_ids()
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


@dataclass(frozen=True)
class Target:
    """One declared index of one tenant's table, as the commands walk them."""

    tenant: str
    table: str
    label: str  # "<tenant> <package>/<collection> <index>", for output
    layout: IndexedTable
    record: RecordType
    index: str


def targets(tenants: list[str], only: set[str] | None = None) -> Iterator[Target]:
    """Yield every declared index (``only`` those named) of every table of ``tenants``."""
    kv = default_kv()
    for tenant in tenants:
        for collection in declared():
            layout = collection.layout(kv)
            for instance in collection.collections(kv, tenant):
                table = TenantKv(kv, collection.package).table(tenant, instance)
                for record in collection.records:
                    for index in record.indexes:
                        if only is None or index.name in only:
                            label = f"{tenant} {collection.package}/{instance} {index.name}"
                            yield Target(tenant, table, label, layout, record, index.name)


def unbuilt(tenants: list[str]) -> list[tuple[str, str, str]]:
    """Return ``(tenant, table, index)`` for each declared index not built in a table with records."""
    kv = default_kv()
    return [
        (t.tenant, t.table, t.index)
        for t in targets(tenants)
        if t.layout.state(t.table, t.index) != "built" and kv.scan(t.table, prefix=t.record.prefix, limit=1)
    ]


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
        built = 0
        for t in targets(tenant_ids(options["tenant"]), index_names(options["index"])):
            if t.layout.state(t.table, t.index) == "built" and not options["rebuild"]:
                continue

            def show(done: int, label: str = t.label) -> None:
                sys.stdout.write(f"\r  {label}: {done} records")
                sys.stdout.flush()

            def sweep(checked: int, label: str = t.label) -> None:  # an in-place upgrade's second phase
                sys.stdout.write(f"\r  {label}: upgraded, {checked} entries checked for older ones")
                sys.stdout.flush()

            done = t.layout.build(
                t.table, t.index, batch=options["batch"], rebuild=options["rebuild"], progress=show, swept=sweep
            )
            self.stdout.write(f"\r  {t.label}: {done} records indexed, built")
            built += 1
        if options["index"] is None:
            built += self._derive(tenant_ids(options["tenant"]))
        self.stdout.write(f"botmesh_reindex: {built} index(es) built")

    def _derive(self, tenants: list[str]) -> int:
        """Bring the declared derived data (the CRM's segment membership) up to date; return how many ran."""
        kv = default_kv()
        ran = 0
        for tenant in tenants:
            for collection in declared():
                if collection.derive is None:
                    continue
                done = collection.derive(kv, tenant)
                if done:
                    ran += 1
                    label = f"{tenant} {collection.package}/{collection.collection} (derived)"
                    self.stdout.write(f"  {label}: {done} records read, built")
        return ran
