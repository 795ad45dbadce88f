"""Logical exports (JSON lines) of a Kv or a journal: for Redis and memory, or any backend.

``kv.jsonl``: a header line, then one line per entry::

    {"format": "botmesh-kv-export/1"}
    {"t": table, "k": key, "v": value, "ver": version, "exp": expires_at or null}

``journal.jsonl``: a header line, one line per record (the ``EventRecord``
fields), then a trailer with the fencing counter read after the last record,
so it is at least every token in the file::

    {"format": "botmesh-journal-export/1"}
    {"id": ..., "type": ..., "state": ..., "fencing_token": ..., ...}
    {"fencing_counter": n, "records": n}

Each entry and each record is copied atomically; a table or journal that
changes during the export is not one point in time (Redis has no snapshot
read): the README says so, and says how to stop writers for an exact copy.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from botmesh_admin.events.base import EventJournal, EventRecord, RecordExport
from botmesh_admin.kv.base import DurableKv, Entry, EntryImport, TableListing

from .manifest import BackupError

KV_FORMAT = "botmesh-kv-export/1"
JOURNAL_FORMAT = "botmesh-journal-export/1"
PAGE = 1000


def _line(out: IO[str], obj: Any) -> None:
    out.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n")


def kv_entries(kv: DurableKv) -> Iterator[tuple[str, Entry]]:
    """Yield ``(table, entry)`` for every live entry of ``kv``, table by table, key order."""
    if not isinstance(kv, TableListing):
        raise BackupError(f"the Kv backend {type(kv).__name__} cannot list its tables")
    for table in kv.tables():
        after = None
        while page := kv.scan(table, after=after, limit=PAGE):
            for entry in page:
                yield table, entry
            after = page[-1].key


def kv_export(kv: DurableKv, target: Path) -> dict[str, int]:
    """Write every table of ``kv`` to ``target``; return ``{"tables", "entries"}``."""
    tables: set[str] = set()
    entries = 0
    with target.open("w", encoding="utf-8") as out:
        _line(out, {"format": KV_FORMAT})
        for table, e in kv_entries(kv):
            _line(out, {"t": table, "k": e.key, "v": e.value, "ver": e.version, "exp": e.expires_at})
            tables.add(table)
            entries += 1
    return {"tables": len(tables), "entries": entries}


def _read_lines(source: Path, fmt: str) -> Iterator[dict[str, Any]]:
    with source.open(encoding="utf-8") as fh:
        header = json.loads(fh.readline() or "{}")
        if header.get("format") != fmt:
            raise BackupError(f"{source.name} is not a {fmt} file")
        for number, line in enumerate(fh, start=2):
            try:
                yield json.loads(line)
            except ValueError as exc:
                raise BackupError(f"{source.name} line {number}: {exc}") from None


def kv_import(kv: DurableKv, source: Path, *, replace: bool) -> dict[str, int]:
    """Load ``source`` into ``kv``; with ``replace``, drop each table first. Return counts."""
    if not isinstance(kv, EntryImport):
        raise BackupError(f"the Kv backend {type(kv).__name__} cannot import entries")
    tables: set[str] = set()
    loaded = 0
    batch: list[Entry] = []
    table: str | None = None

    def flush() -> None:
        nonlocal loaded
        if table is not None and batch:
            loaded += kv.import_entries(table, batch)
            batch.clear()

    for row in _read_lines(source, KV_FORMAT):
        if row["t"] != table or len(batch) >= PAGE:
            flush()
            if row["t"] != table:
                table = row["t"]
                if replace and table not in tables:
                    kv.drop(table)
                tables.add(table)
        batch.append(Entry(row["k"], row["v"], row["ver"], row["exp"]))
    flush()
    return {"tables": len(tables), "entries": loaded}


def journal_export(journal: EventJournal, target: Path) -> dict[str, int]:
    """Write every record of ``journal`` and its fencing counter to ``target``; return counts."""
    if not isinstance(journal, RecordExport):
        raise BackupError(f"the journal backend {type(journal).__name__} cannot export records")
    count = 0
    with target.open("w", encoding="utf-8") as out:
        _line(out, {"format": JOURNAL_FORMAT})
        after = None
        while page := journal.export_records(after=after, limit=PAGE):
            for record in page:
                _line(out, dataclasses.asdict(record))
            count += len(page)
            after = page[-1].id
        _line(out, {"fencing_counter": journal.fencing_counter(), "records": count})
    return {"records": count}


def journal_import(journal: EventJournal, source: Path) -> dict[str, int]:
    """Load ``source`` into ``journal`` (records as they were, the fencing counter raised)."""
    if not isinstance(journal, RecordExport):
        raise BackupError(f"the journal backend {type(journal).__name__} cannot import records")
    fields = {f.name for f in dataclasses.fields(EventRecord)}
    batch: list[EventRecord] = []
    loaded = 0
    trailer: dict[str, Any] | None = None
    for row in _read_lines(source, JOURNAL_FORMAT):
        if "fencing_counter" in row:
            trailer = row
            continue
        batch.append(EventRecord(**{k: v for k, v in row.items() if k in fields}))
        if len(batch) >= PAGE:
            loaded += journal.import_records(batch)
            batch = []
    if trailer is None:
        raise BackupError(f"{source.name} is truncated: no fencing counter at its end")
    loaded += journal.import_records(batch, fencing_counter=int(trailer["fencing_counter"]))
    if loaded != trailer["records"]:
        raise BackupError(f"{source.name} holds {loaded} records, its trailer says {trailer['records']}")
    return {"records": loaded}
