"""Back up a filled installation while a worker writes to it, restore into an empty one, compare.

One test per store layout that runs here: the embedded default (SQLite files),
file snapshots, PostgreSQL with a Redis Kv and journal, and PostgreSQL with the
Kv in a second database. Each compares every Django row, every Kv entry, every
journal record, and what the selectors show for the demo tenant (conversations
with messages and notes, contacts, segments, campaigns, plugins, versions).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import Installation

WRITER = "writer"


def run_round_trip(source: Installation, target: Installation, backup: Path) -> tuple[dict, dict, dict]:
    """Fill ``source``, back it up while a writer runs, restore into ``target``.

    Return (source dump after the writer stopped, target dump, facts about the
    writer: steps done before and after the backup).
    """
    source.finish(source.site("fill"), "fill")  # migrates first

    writer = source.site("writer")
    assert writer.stdout is not None
    steps: list[int] = []
    reader = threading.Thread(target=lambda: steps.extend(int(line) for line in writer.stdout), daemon=True)
    reader.start()
    try:
        _wait_for(lambda: len(steps) >= 5, writer, source)
        before = len(steps)
        source.run("backup", str(backup))
        after = len(steps)
    finally:
        writer.stdin.close()  # type: ignore[union-attr]
        writer.wait(timeout=60)
        reader.join(timeout=10)
    assert writer.returncode == 0, source.log("writer").read_text()[-3000:]
    assert after > before, "the writer made no progress while the backup ran"

    source_dump: dict[str, Any] = {}
    dumping = threading.Thread(target=lambda: source_dump.update(source.dump()))
    dumping.start()  # the source is read while the target restores: two processes at once
    out = target.run("restore", str(backup))
    assert "restored the backup of" in out.stdout
    target_dump = target.dump()
    dumping.join(timeout=120)
    assert source_dump, "the source dump failed"
    return source_dump, target_dump, {"before": before, "after": after, "total": len(steps)}


def _wait_for(ready: Any, proc: Any, site: Installation, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert proc.poll() is None, site.log("writer").read_text()[-3000:]
        assert time.monotonic() < deadline, "the writer did not start"
        time.sleep(0.05)


def assert_same_except_writer(src: dict[str, Any], dst: dict[str, Any], writer: dict[str, int]) -> None:
    """Everything but the writer's tenant (and process-local traces/counters) is equal.

    The writer's contacts and journal records in the copy are each a prefix of
    what it wrote (a snapshot never holds a later write without an earlier one),
    and the journal, copied first, never runs ahead of the Kv.
    """
    assert dst["django"] == src["django"]
    assert dst["views"] == src["views"]
    assert len(dst["views"]["conversations"]) >= 30 and len(dst["views"]["contacts"]) >= 200
    assert dst["views"]["campaigns"] and dst["views"]["plugins"] and dst["views"]["versions"]
    assert any(c["notes"] for c in dst["views"]["conversations"])

    def kept(tables: dict[str, Any]) -> dict[str, Any]:
        return {t: e for t, e in tables.items() if f"/{WRITER}/" not in t and not t.startswith("observability/")}

    assert kept(dst["kv"]) == kept(src["kv"])
    assert sum(len(e) for e in kept(dst["kv"]).values()) > 300

    def records(dump: dict[str, Any], tenant: str | None = None) -> list[dict[str, Any]]:
        return [r for r in dump["journal"] if (r["tenant"] == WRITER) == (tenant == WRITER)]

    assert records(dst) == records(src)
    assert {r["state"] for r in records(dst)} >= {"done", "pending"}
    assert any(r["last_error"] for r in records(dst))
    tokens = [r["fencing_token"] for r in dst["journal"]]
    assert dst["fencing_counter"] >= max(tokens)

    contacts = dst["kv"].get(f"crm/{WRITER}/contacts", [])
    names = sorted(e[1]["name"] for e in contacts if isinstance(e[1], dict) and e[1].get("name"))
    ticks = sorted(r["payload"]["n"] for r in records(dst, WRITER))
    k, j = len(names), len(ticks)
    assert names == [f"w{i:05d}" for i in range(k)], "the writer's contacts are not a prefix"
    assert ticks == list(range(j)), "the writer's journal records are not a prefix"
    assert writer["before"] <= k <= writer["total"] + 1
    assert j <= k, "the journal copy holds a record whose contact the later Kv copy lacks"
    for record in records(dst, WRITER):
        assert record in src["journal"]


@pytest.mark.slow
def test_sqlite_default_round_trip_through_a_tar(tmp_path: Path) -> None:
    """The embedded default: three SQLite files, copied with the online backup API while written."""
    source, target = Installation(tmp_path / "source"), Installation(tmp_path / "target")
    src, dst, writer = run_round_trip(source, target, tmp_path / "backup.tar.gz")
    assert_same_except_writer(src, dst, writer)
    refused = target.run("restore", str(tmp_path / "backup.tar.gz"), check=False)
    assert refused.returncode != 0 and "not empty" in refused.stderr and "--force" in refused.stderr


@pytest.mark.slow
def test_file_backends_round_trip(tmp_path: Path) -> None:
    """FileKv and FileEventJournal: their snapshot files are copied while the writer owns them."""

    def files(name: str) -> Installation:
        d = tmp_path / name
        return Installation(
            d, {"BOTMESH_KV_URL": f"file://{d}/kv.json", "BOTMESH_JOURNAL_URL": f"file://{d}/journal.json"}
        )

    source, target = files("source"), files("target")
    src, dst, writer = run_round_trip(source, target, tmp_path / "backup")
    assert_same_except_writer(src, dst, writer)
    manifest = json.loads((tmp_path / "backup" / "manifest.json").read_text())
    assert manifest["parts"]["kv"] == {"format": "file", "file": "kv.json"}


@pytest.mark.slow
@pytest.mark.services
def test_postgresql_with_redis_kv_and_journal_round_trip(tmp_path: Path, new_pg_database, private_redis) -> None:
    """pg_dump of the database; the Redis Kv and Redis journal by a logical export of everything."""

    def layout(name: str, db: int) -> Installation:
        redis = f"{private_redis}/{db}"
        return Installation(tmp_path / name, {"DATABASE_URL": new_pg_database(), "BOTMESH_KV_URL": redis,
                                              "BOTMESH_JOURNAL_URL": redis})  # fmt: skip

    source, target = layout("source", 0), layout("target", 1)
    src, dst, writer = run_round_trip(source, target, tmp_path / "backup")
    assert_same_except_writer(src, dst, writer)
    manifest = json.loads((tmp_path / "backup" / "manifest.json").read_text())
    assert {p["format"] for p in manifest["parts"].values()} == {"pg_dump", "jsonl"}


@pytest.mark.slow
@pytest.mark.services
def test_postgresql_with_the_kv_in_another_database_round_trip(tmp_path: Path, new_pg_database) -> None:
    """The journal shares the Django database (one dump); the Kv's own database gets a table dump."""

    def layout(name: str) -> Installation:
        db, kv_db = new_pg_database(), new_pg_database()
        return Installation(tmp_path / name, {"DATABASE_URL": db, "BOTMESH_KV_URL": kv_db,
                                              "BOTMESH_JOURNAL_URL": db})  # fmt: skip

    source, target = layout("source"), layout("target")
    src, dst, writer = run_round_trip(source, target, tmp_path / "backup")
    assert_same_except_writer(src, dst, writer)
    parts = json.loads((tmp_path / "backup" / "manifest.json").read_text())["parts"]
    assert parts["journal"] == {"format": "with", "part": "database"}
    assert parts["kv"] == {"format": "pg_dump", "file": "kv.pgdump", "tables": ["botmesh_kv"]}
