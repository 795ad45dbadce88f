"""Upgrade safety: reversible migrations, and no restore of a backup from a newer schema."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from botmesh_admin.backup import FORMAT, FORMAT_VERSION
from botmesh_admin.backup.manifest import BackupError, check_schema, schema_state


def latest_migration(app: str) -> str:
    """The newest migration of ``app`` in this checkout (its leaf in the migration graph), read from the files."""
    from django.db.migrations.loader import MigrationLoader

    (leaf,) = [
        name for label, name in MigrationLoader(None, ignore_no_migrations=True).graph.leaf_nodes() if label == app
    ]
    return leaf


REPO = Path(__file__).resolve().parents[2]


REVERSIBILITY = """
import json
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

executor = MigrationExecutor(connection)
graph = executor.loader.graph
leaves = graph.leaf_nodes()
irreversible = [f"{a}.{n}: {op.describe()}" for a, n in graph.nodes
                for op in graph.nodes[(a, n)].operations if not op.reversible]
executor.migrate(leaves)
full = sorted(connection.introspection.table_names())
executor.loader.build_graph()
executor.migrate([(app, None) for app in sorted({app for app, _ in leaves})])
zero = sorted(connection.introspection.table_names())
executor.loader.build_graph()
executor.migrate(leaves)
again = sorted(connection.introspection.table_names())
print(json.dumps({"irreversible": irreversible, "full": full, "zero": zero, "again": again,
                  "apps": sorted({app for app, _ in leaves})}))
"""


def test_every_app_migrates_to_zero_and_back(tmp_path: Path) -> None:
    """On a fresh SQLite database, every app unapplies all its migrations, then applies them again."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(BOTMESH_DATA_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="botmesh_admin.settings")
    proc = subprocess.run([sys.executable, "manage.py", "shell", "-c", REVERSIBILITY], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["irreversible"] == []
    assert {"tenancy", "channels", "auth", "contenttypes", "sessions"} <= set(result["apps"])
    assert {"tenancy_tenant", "tenancy_apitoken", "auth_user", "channels_channelconfig"} <= set(result["full"])
    assert result["zero"] == ["django_migrations"]
    assert result["again"] == result["full"]


@pytest.mark.django_db
def test_schema_state_names_the_latest_applied_migration_of_every_app() -> None:
    state = schema_state(connection)
    assert state["tenancy"] == latest_migration("tenancy") and state["tenancy"].startswith("0005_")
    assert state["auth"].startswith("0012_")
    assert state["contenttypes"] == "0002_remove_content_type_name"


def fake_backup(directory: Path, schema: dict[str, str], version: int = FORMAT_VERSION) -> Path:
    directory.mkdir()
    parts = {role: {"format": "jsonl", "file": f"{role}.jsonl"} for role in ("database", "kv", "journal")}
    doc = {"format": FORMAT, "format_version": version, "schema": schema, "parts": parts,
           "backends": {}, "files": {}, "created_at": "2031-01-01T00:00:00Z"}  # fmt: skip
    (directory / "manifest.json").write_text(json.dumps(doc))
    return directory


@pytest.mark.django_db
def test_a_backup_from_a_newer_schema_is_refused_naming_the_app_and_migration(tmp_path: Path) -> None:
    backup = fake_backup(
        tmp_path / "b", {"tenancy": "0099_from_the_future", "auth": "0012_alter_user_first_name_max_length"}
    )
    with pytest.raises(CommandError) as refused:
        call_command("restore", str(backup))
    message = str(refused.value)
    assert "newer schema" in message
    assert "app 'tenancy' is at migration '0099_from_the_future'" in message
    assert f"the latest here is '{latest_migration('tenancy')}'" in message
    assert "Upgrade botmesh-admin" in message


@pytest.mark.django_db
def test_a_backup_with_an_app_this_version_lacks_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BackupError, match="app 'loyalty' is at migration '0001_initial'.*no such app"):
        check_schema({"loyalty": "0001_initial"}, connection)


@pytest.mark.django_db
def test_a_backup_from_an_older_schema_is_accepted() -> None:
    check_schema({"tenancy": "0001_initial", "auth": "0001_initial"}, connection)


@pytest.mark.django_db
def test_a_backup_of_a_newer_format_is_refused(tmp_path: Path) -> None:
    backup = fake_backup(tmp_path / "b", {}, version=FORMAT_VERSION + 1)
    with pytest.raises(CommandError, match="format version 2; this version of botmesh-admin reads up to 1"):
        call_command("restore", str(backup))
