"""``scripts/smoke_production.py`` picks a free port (issue 15, item 11).

Before: it used port 8765 whatever listened there; with that port taken,
gunicorn could not bind and the test talked to the other server, failing with
a misleading message.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent.parent / "scripts" / "smoke_production.py"


def _script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("smoke_production", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_a_port_setting_it_uses_a_free_port() -> None:
    """While the port it chose is held, it chooses another free one (the old fixed 8765 came back)."""
    smoke = _script()
    first = smoke.choose_port({})
    with socket.socket() as held:
        held.bind(("127.0.0.1", first))
        held.listen()
        second = smoke.choose_port({})
        assert second != first
        with socket.socket() as ours:
            ours.bind(("127.0.0.1", second))  # free: gunicorn can bind it


def test_a_taken_port_setting_stops_at_once_naming_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if k != "BOTMESH_PROD_DATABASE_URL"}
        proc = subprocess.run(
            [sys.executable, str(SCRIPT)],
            env={**env, "BOTMESH_SMOKE_PORT": str(port)},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 1
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith(f"smoke test: port {port} (BOTMESH_SMOKE_PORT) is taken by another process")
    )
