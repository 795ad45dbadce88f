"""Installations for backup tests: each one a data dir plus the URLs of its stores.

Every command runs in its own process (``manage.py`` or ``tests.backup.site``)
with the installation's environment, exactly as an operator would run it.
PostgreSQL databases are created fresh per test and dropped after; Redis is a
private ``redis-server`` per test (db 0 for the source, db 1 for the target),
so nothing is shared with other tests or xdist workers.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
LEAKS = ("DATABASE_URL", "REDIS_URL", "BOTMESH_PROFILE", "SECRET_KEY", "DEBUG", "BOTMESH_KV_URL",
         "BOTMESH_JOURNAL_URL", "DJANGO_SETTINGS_MODULE", "SECRET_KEY_FALLBACKS", "BOTMESH_HASH_KEY")  # fmt: skip
TIMEOUT_S = 120


@dataclass
class Installation:
    """One installation: ``env`` configures its stores; ``run`` and ``site`` execute in it."""

    data_dir: Path
    urls: dict[str, str] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in LEAKS}
        env.update(
            DJANGO_SETTINGS_MODULE="botmesh_admin.settings", BOTMESH_DATA_DIR=str(self.data_dir),
            CELERY_BROKER_URL="memory://", PYTHONPATH=str(REPO), **self.urls,
        )  # fmt: skip
        return env

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``manage.py *args``; with ``check``, fail the test (showing stderr) on a non-zero exit."""
        proc = subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=self.env,
                              capture_output=True, text=True, timeout=TIMEOUT_S)  # fmt: skip
        if check and proc.returncode != 0:
            pytest.fail(f"manage.py {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
        return proc

    def site(self, what: str) -> subprocess.Popen[str]:
        """Start ``tests.backup.site <what>`` (stdin and stdout piped, stderr to ``<what>.log``).

        Its log goes to a file, not a pipe: nobody reads a pipe while the
        process runs, and a full pipe would stop it mid-write.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self.log(what).open("w") as log:
            return subprocess.Popen([sys.executable, "-m", "tests.backup.site", what], cwd=REPO, env=self.env,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                    text=True)  # fmt: skip

    def log(self, what: str) -> Path:
        return self.data_dir / f"{what}.log"

    def finish(self, proc: subprocess.Popen[str], what: str) -> str:
        """Wait for ``proc``; return its stdout; fail the test with its log tail on a non-zero exit."""
        out, _ = proc.communicate(timeout=TIMEOUT_S)
        if proc.returncode != 0:
            pytest.fail(f"site {what} exited {proc.returncode}:\n{self.log(what).read_text()[-3000:]}")
        return out

    def dump(self) -> dict[str, Any]:
        return json.loads(self.finish(self.site("dump"), "dump"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def private_redis(redis_url: str, tmp_path: Path) -> Iterator[str]:
    """``redis://127.0.0.1:<port>`` of a redis-server of this test only (needs the shared one to exist)."""
    if not shutil.which("redis-server"):
        pytest.skip("redis-server not installed")
    port = _free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    import redis

    client = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                proc.kill()
                raise
            time.sleep(0.05)
    client.close()
    yield f"redis://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def new_pg_database(postgres_url: str) -> Iterator[Any]:
    """A function returning the URL of a fresh PostgreSQL database; all are dropped after the test."""
    import psycopg

    created: list[str] = []
    base = postgres_url.rsplit("/", 1)[0]

    def make() -> str:
        name = f"bk_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        created.append(name)
        return f"{base}/{name}"

    yield make
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        for name in created:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
