"""``manage.py botmesh_run`` (the README's run command): what it says when it cannot load the demo."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_missing_demo_fixtures_stop_the_start_with_one_line_naming_the_fix(tmp_path: Path) -> None:
    env = {**os.environ, "BOTMESH_FIXTURES": str(tmp_path / "nowhere"), "BOTMESH_DATA_DIR": str(tmp_path),
           "DJANGO_SETTINGS_MODULE": "botmesh_admin.settings", "DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite3"}
    done = subprocess.run([sys.executable, "manage.py", "botmesh_run", "--port", "0"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert f"demo fixtures not found in {tmp_path / 'nowhere'}" in done.stderr
    assert "BOTMESH_FIXTURES" in done.stderr and "--no-demo" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "logs").exists(), "nothing was started"
