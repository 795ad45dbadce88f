"""The deployment files parse and say what the README promises (no Docker engine runs here)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def _yaml():
    return pytest.importorskip("yaml", reason="PyYAML is needed to read the Compose file")


def compose() -> dict:
    return _yaml().safe_load((DEPLOY / "compose.yaml").read_text())


def test_compose_file_matches_the_compose_spec_schema() -> None:
    schema = json.loads((DEPLOY / "compose-spec.schema.json").read_text())
    errors = [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(compose())]
    assert errors == []


def test_compose_runs_the_production_layout() -> None:
    services = compose()["services"]
    assert {"postgres", "redis", "web", "worker", "beat"} <= set(services)
    assert services["web"]["deploy"]["replicas"] == 2
    assert "/readyz" in " ".join(services["web"]["healthcheck"]["test"])
    for name in ("web", "worker", "beat"):
        grace = int(services[name]["stop_grace_period"].rstrip("s"))
        assert grace > int(services[name]["environment"]["BOTMESH_DRAIN_TIMEOUT"]), name
        # no secret value in the file: secrets come from files
        env = services[name]["environment"]
        assert "SECRET_KEY" not in env and env["SECRET_KEY_FILE"].startswith("/run/secrets/")


def test_dockerfile_runs_as_non_root_without_secrets() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^USER botmesh$", text, re.M)
    assert not re.search(r"SECRET_KEY=|PASSWORD=|TOKEN=", text)
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "var", ".env"} <= set(ignored)


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
@pytest.mark.parametrize("unit", sorted(p.name for p in (DEPLOY / "systemd").glob("*.service")))
def test_systemd_unit_verifies(unit: str, tmp_path: Path) -> None:
    # Point the unit at this checkout so `verify` can find the executables.
    text = (DEPLOY / "systemd" / unit).read_text().replace("/opt/botmesh/.venv", str(ROOT / ".venv"))
    (tmp_path / unit).write_text(text)
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(tmp_path / unit)], capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Unknown" not in proc.stdout + proc.stderr


def test_systemd_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze not installed")
    (tmp_path / "bad.service").write_text("[Service]\nExecStart=/nonexistent/bin/x\nFooBar=1\n")
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(tmp_path / "bad.service")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode != 0 and "Unknown key 'FooBar'" in proc.stderr


def test_image_and_compose_can_take_backups() -> None:
    """pg_dump is in the image; the compose "backup" tool writes to its own volume, not a layer."""
    assert re.search(r"apt-get install[^\n]*postgresql-client", (ROOT / "Dockerfile").read_text())
    doc = compose()
    backup = doc["services"]["backup"]
    assert backup["profiles"] == ["tools"] and "manage.py backup /backups/" in " ".join(backup["command"])
    assert "backups:/backups" in backup["volumes"] and "backups" in doc["volumes"]


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
def test_backup_timer_verifies(tmp_path: Path) -> None:
    for unit in ("botmesh-backup.service", "botmesh-backup.timer"):
        text = (DEPLOY / "systemd" / unit).read_text().replace("/opt/botmesh/.venv", str(ROOT / ".venv"))
        (tmp_path / unit).write_text(text)
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(tmp_path / "botmesh-backup.timer")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
