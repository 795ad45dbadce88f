"""``manage.py botmesh_run`` (the README's run command): what it says when it cannot load the demo."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.faults.servers import project_env

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


class _AnswersEverything(http.server.BaseHTTPRequestHandler):
    """Another server on the port: it even answers ``/readyz`` with 200 (a second admin, say)."""

    def do_GET(self) -> None:
        body = b'{"status": "ready"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_taken_port_stops_the_start_at_once_naming_the_port_and_how_to_choose_another(tmp_path: Path) -> None:
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AnswersEverything)
    port = other.server_address[1]
    threading.Thread(target=other.serve_forever, daemon=True).start()
    env = {**project_env(tmp_path), "BOTMESH_DATA_DIR": str(tmp_path / "data")}
    try:
        started = time.monotonic()
        done = subprocess.run([sys.executable, "manage.py", "botmesh_run", "--no-demo", "--port", str(port)],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    finally:
        other.shutdown()
        other.server_close()
    assert done.returncode != 0, done.stdout
    assert "is running at" not in done.stdout
    [line] = done.stderr.strip().splitlines()
    assert f"port {port} of 127.0.0.1 is already in use" in line
    assert f"--port {port + 1}" in line and f"BOTMESH_PORT={port + 1}" in line
    assert not (tmp_path / "data" / "logs").exists(), "nothing was started"
    assert time.monotonic() - started < 30
