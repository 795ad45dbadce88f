"""How stores map to backup parts, the checks a restore makes first, and the logical exports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from botmesh_admin.backup import logical, manifest
from botmesh_admin.backup.layout import PgTarget, Store, _url_store, plan
from botmesh_admin.backup.manifest import BackupError
from botmesh_admin.backup.services import _check_layout
from botmesh_admin.events import Envelope
from botmesh_admin.events.memory import MemoryEventJournal
from botmesh_admin.kv import Put
from botmesh_admin.kv.memory import MemoryKv

PG = "postgresql://botmesh:s3cr3t-pw@db.internal:5433/botmesh?sslmode=require"


def sqlite(role: str, path: str) -> Store:
    return Store(role, "sqlite", f"sqlite:///{path}", path=Path(path))


def test_stores_in_one_postgresql_database_share_its_dump() -> None:
    stores = {"database": Store("database", "postgresql", "", pg=PgTarget.from_url(PG)),
              "kv": _url_store("kv", PG), "journal": _url_store("journal", PG + "&namespace=prod")}  # fmt: skip
    assert plan(stores) == {
        "database": {"format": "pg_dump", "file": "database.pgdump"},
        "kv": {"format": "with", "part": "database"},
        "journal": {"format": "with", "part": "database"},
    }


def test_a_kv_and_journal_in_another_database_get_one_dump_of_their_tables() -> None:
    other = "postgresql://botmesh:pw@db.internal:5433/events"
    stores = {"database": sqlite("database", "/d/db.sqlite3"), "kv": _url_store("kv", other),
              "journal": _url_store("journal", other + "?namespace=prod")}  # fmt: skip
    parts = plan(stores)
    assert parts["kv"] == {"format": "pg_dump", "file": "kv.pgdump",
                           "tables": ["botmesh_events_prod", "botmesh_events_prod_fence", "botmesh_kv"]}  # fmt: skip
    assert parts["journal"] == {"format": "with", "part": "kv"}


def test_sqlite_files_redis_and_memory() -> None:
    stores = {"database": sqlite("database", "/d/db.sqlite3"), "kv": sqlite("kv", "/d/db.sqlite3"),
              "journal": _url_store("journal", "redis://r:6379/0")}  # fmt: skip
    assert plan(stores) == {
        "database": {"format": "sqlite", "file": "database.sqlite3"},
        "kv": {"format": "with", "part": "database"},
        "journal": {"format": "jsonl", "file": "journal.jsonl"},
    }
    assert plan({**stores, "kv": _url_store("kv", "memory://")})["kv"] == {"format": "jsonl", "file": "kv.jsonl"}
    assert plan({**stores, "kv": _url_store("kv", "file:///d/kv.json")})["kv"] == {"format": "file", "file": "kv.json"}


def test_the_postgresql_password_never_reaches_a_command_line() -> None:
    target = PgTarget.from_url(PG)
    assert "s3cr3t-pw" not in target.conninfo() and "s3cr3t-pw" not in repr(target)
    assert target.conninfo() == "postgresql://botmesh@db.internal:5433/botmesh?sslmode=require"
    assert target.env()["PGPASSWORD"] == "s3cr3t-pw"


def test_restore_refuses_a_different_layout_naming_the_variable() -> None:
    backup = {
        "database": {"format": "sqlite", "file": "database.sqlite3"},
        "kv": {"format": "sqlite", "file": "kv.sqlite3"},
        "journal": {"format": "jsonl", "file": "j"},
    }
    here_stores = {"database": sqlite("database", "/x/db"), "kv": _url_store("kv", "redis://r/0"),
                   "journal": _url_store("journal", PG)}  # fmt: skip
    with pytest.raises(BackupError, match=r"keeps the kv as an SQLite file, this installation as a logical "
                                          r"export \(BOTMESH_KV_URL=redis\)"):  # fmt: skip
        _check_layout(backup, plan(here_stores), here_stores)
    # A logical export loads anywhere: only the kv part was in the way.
    _check_layout({**backup, "kv": {"format": "jsonl", "file": "kv.jsonl"}}, plan(here_stores), here_stores)


def test_a_damaged_or_incomplete_backup_is_refused(tmp_path: Path) -> None:
    (tmp_path / "kv.jsonl").write_text('{"format":"botmesh-kv-export/1"}\n')
    doc = {"format": "botmesh-backup", "format_version": 1, "schema": {}, "backends": {},
           "parts": {"kv": {"format": "jsonl", "file": "kv.jsonl"}}}  # fmt: skip
    manifest.write(tmp_path, doc)
    assert manifest.read(tmp_path)["files"]["kv.jsonl"]["bytes"] == 33
    (tmp_path / "kv.jsonl").write_text('{"format":"botmesh-kv-export/1"}\n{"t":"x"}\n')
    with pytest.raises(BackupError, match="damaged: kv.jsonl does not match its checksum"):
        manifest.read(tmp_path)
    (tmp_path / "kv.jsonl").unlink()
    with pytest.raises(BackupError, match="incomplete: kv.jsonl is missing"):
        manifest.read(tmp_path)
    with pytest.raises(BackupError, match="not a botmesh-admin backup: no manifest.json"):
        manifest.read(tmp_path / "nothing")


def test_kv_export_and_import_keep_every_entry(tmp_path: Path) -> None:
    source = MemoryKv()
    source.commit("crm/acme/contacts", [Put(f"c{i:04d}", {"i": i}) for i in range(2500)])
    source.commit("crm/acme/contacts", [Put("c0000", "v2", expect=1)])
    source.commit("hub/acme/plugins", [Put("p", [1], ttl_ms=3_600_000)])
    assert logical.kv_export(source, tmp_path / "kv.jsonl") == {"tables": 2, "entries": 2501}
    target = MemoryKv()
    target.commit("crm/acme/contacts", [Put("stale", 1)])
    target.commit("old/acme/t", [Put("k", 1)])
    assert logical.kv_import(target, tmp_path / "kv.jsonl", replace=True) == {"tables": 2, "entries": 2501}
    for table in source.tables():
        assert target.scan(table, limit=10000) == source.scan(table, limit=10000)
    assert target.get("crm/acme/contacts", "stale") is None


def test_journal_export_and_import_keep_records_and_counter(tmp_path: Path) -> None:
    source = MemoryEventJournal()
    for i in range(1200):
        source.append(Envelope(type="t.x", tenant="acme", payload={"i": i}, idempotency_key=f"k{i}"))
    leased = source.claim(source.clock(), 60_000)
    assert logical.journal_export(source, tmp_path / "j.jsonl") == {"records": 1200}
    target = MemoryEventJournal()
    assert logical.journal_import(target, tmp_path / "j.jsonl") == {"records": 1200}
    assert target.export_records(limit=5000) == source.export_records(limit=5000)
    assert target.fencing_counter() == leased.fencing_token
    lines = (tmp_path / "j.jsonl").read_text().splitlines()
    (tmp_path / "cut.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(BackupError, match="truncated"):
        logical.journal_import(MemoryEventJournal(), tmp_path / "cut.jsonl")
    assert json.loads(lines[-1]) == {"fencing_counter": 1, "records": 1200}
