"""Record types and writers shared by the index tests and their spawned processes.

Kept free of pytest imports so a spawned process starts quickly.
"""

from __future__ import annotations

import random
from typing import Any

from botmesh_admin.kv import ABSENT, ConflictError, Delete, DurableKv, Put, connect
from botmesh_admin.kv.indexes import (
    CountIndex,
    Desc,
    Each,
    IndexedTable,
    RecordChange,
    RecordType,
    ValueIndex,
)

STATUSES = ("open", "pending", "resolved")
TAGS = ("vip", "lead", "es", "b2b")

TICKET = RecordType(
    "ticket",
    "t/",
    (
        ValueIndex(
            "by_status",
            fields=("status", Desc("at")),
            payload=lambda r: {"status": r["status"], "at": r["at"]},
            reads=("status", "at"),
        ),
        ValueIndex("by_tag", fields=(Each("tags"), "owner")),  # no reads: computed on every change
        CountIndex("n_status", fields=("status",), reads=("status",)),
        CountIndex("n_tag", fields=(Each("tags"),)),
        CountIndex("sum_weight", fields=("owner",), amount=lambda r: r["weight"], reads=("owner", "weight")),
        ValueIndex("owned", fields=("owner",), where=lambda r: r["owner"] is not None, reads=("owner",)),
    ),
)


def tickets(kv: DurableKv) -> IndexedTable:
    """Return the indexed layout of the test tickets over ``kv``."""
    return IndexedTable(kv, (TICKET,))


def random_ticket(rng: random.Random) -> dict[str, Any]:
    """Return a random ticket record."""
    return {
        "status": rng.choice(STATUSES),
        "at": rng.randrange(0, 10**12),
        "tags": rng.sample(TAGS, rng.randrange(0, 3)),
        "owner": rng.choice((None, "ana", "luis")),
        "weight": rng.randrange(0, 4),
    }


def ticket_write(layout: IndexedTable, table: str, key: str, value: dict[str, Any] | None) -> bool:
    """Put (or delete, for ``None``) ticket ``key`` by read + compare-and-set; False on a lost race."""
    kv = layout.kv
    current = kv.get(table, key)
    expect = ABSENT if current is None else current.version
    old = None if current is None else current.value
    if value is None and current is None:
        return True
    op = Delete(key, expect) if value is None else Put(key, value, expect)
    try:
        layout.commit(table, [op], [RecordChange(TICKET, key, old, value)])
    except ConflictError:
        return False
    return True


def churn(kv: DurableKv, table: str, seed: int, writes: int, keys: int = 60) -> int:
    """Do ``writes`` random puts and deletes of tickets ``t/0..keys``; return how many applied."""
    rng = random.Random(seed)
    layout = tickets(kv)
    applied = 0
    for _ in range(writes):
        key = f"t/{rng.randrange(keys):04d}"
        value = None if rng.random() < 0.2 else random_ticket(rng)
        applied += ticket_write(layout, table, key, value)
    return applied


def churn_by_url(url: str, table: str, seed: int, writes: int) -> int:
    """Connect to ``url`` in a fresh process and run ``churn``."""
    kv = connect(url)
    try:
        return churn(kv, table, seed, writes)
    finally:
        kv.close()
