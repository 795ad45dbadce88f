"""Bench only: every store writes its records without the kernel's index upkeep.

``bench/ingest.py --no-index-upkeep`` puts this directory on ``PYTHONPATH`` of
its web and worker processes, so Python imports this module at start-up
(``site`` imports ``sitecustomize``). ``IndexedTable.commit`` then commits only
the store's own operations: no index entries, no counters, no index states and
no read of the old records. That is the write cost of the stores before the
kernel indexes (issue 16, item 7: upkeep must not cost ingest more than 10 %),
a lower bound, since the list and identity pointers the stores kept by hand
before the kernel are skipped as well. Reads of indexes are wrong in such a
process; the bench checks each message by its id, which reads no index.

With ``BOTMESH_BENCH_NO_UPKEEP_TENANT`` set (``bench/ingest.py --upkeep-share``)
only that tenant's tables skip the upkeep: one set of processes then serves a
tenant with every index and one without, and rounds alternate between them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from botmesh_admin.kv import indexes
from botmesh_admin.kv.base import Entry, Op

_ONLY = os.environ.get("BOTMESH_BENCH_NO_UPKEEP_TENANT")
_MARK = f"/{_ONLY}/" if _ONLY else None  # a tenant table is "<package>/<tenant>/<collection>"
_with_upkeep = indexes.IndexedTable.commit


def _commit_without_upkeep(
    self: indexes.IndexedTable, table: str, ops: Sequence[Op], changes: Sequence[indexes.RecordChange]
) -> list[Entry | None]:
    if _MARK is not None and _MARK not in table:
        return _with_upkeep(self, table, ops, changes)
    return self.kv.commit(table, list(ops))


indexes.IndexedTable.commit = _commit_without_upkeep  # type: ignore[method-assign]
