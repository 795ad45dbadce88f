"""Servers and processes a fault test owns: started on free ports, stopped even when the test fails.

Each test builds a ``Processes`` (a context manager) and starts everything
through it, so its ``finally`` ends every process it started — workers, web,
Redis, PostgreSQL — whatever happened in between::

    with Processes(tmp_path) as procs:
        redis = procs.redis()                  # redis-server on a free port
        worker = procs.start("worker", [...])  # output in tmp_path/worker.log
        redis.kill(); redis.start()            # SIGKILL, then again on the same port

``RedisServer`` and ``PostgresServer`` skip the test (fail under
``BOTMESH_REQUIRE_SERVICES=1``) when their binaries are not installed.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests import services

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """Return a TCP port of 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _missing(what: str) -> None:
    reason = f"{what} is not installed (scripts/services.sh installs it)"
    if services.REQUIRE:
        pytest.fail(f"BOTMESH_REQUIRE_SERVICES=1 but {reason}")
    pytest.skip(reason)


def _wait(ready: object, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():  # type: ignore[operator]
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def _stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> None:
    """Send ``sig`` to the process (its whole group), wait, then SIGKILL what is left."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # pool children of a worker that did exit
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


class RedisServer:
    """A ``redis-server`` of the test's own on a free port, with an append-only file in ``directory``."""

    def __init__(self, directory: Path, *, appendonly: bool = True) -> None:
        if not shutil.which("redis-server"):
            _missing("redis-server")
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.appendonly = appendonly
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start (or start again, on the same port and files) and wait until it answers PING."""
        log = open(self.directory / "redis.log", "ab")  # noqa: SIM115 (the server's life)
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
             "--save", "", "--appendonly", "yes" if self.appendonly else "no", "--appendfsync", "always"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        log.close()
        _wait(self.ping, f"redis-server on port {self.port}")

    def ping(self) -> bool:
        done = subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True, text=True)
        return done.stdout.strip() == "PONG"

    def kill(self) -> None:
        """SIGKILL the server (a crash: no shutdown, no final write)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc, timeout_s=5)


class PostgresServer:
    """A PostgreSQL cluster of the test's own: ``initdb`` into ``directory``, served on a free port.

    As root the server runs as the ``postgres`` user (PostgreSQL refuses root);
    otherwise as the current user. Trust authentication on 127.0.0.1 only.
    """

    def __init__(self) -> None:
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
        if not bins:
            _missing("PostgreSQL (/usr/lib/postgresql/*/bin)")
        self.bin = Path(bins[-1]).parent
        # Its own directory right under the temp dir: pytest's tmp_path is inside root's
        # 0700 directories, which the postgres user could not enter.
        self.directory = Path(tempfile.mkdtemp(prefix="botmesh-fault-pg-"))
        self.data = self.directory / "data"
        self.port = free_port()
        self.user: str | None = None
        if os.geteuid() == 0:
            self.user = "postgres"
            try:
                entry = pwd.getpwnam(self.user)
            except KeyError:
                _missing("the postgres user")
            os.chown(self.directory, entry.pw_uid, entry.pw_gid)
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/botmesh"

    def _run(self, *args: str, timeout_s: float = 60) -> None:
        subprocess.run([str(self.bin / args[0]), *args[1:]], check=True, capture_output=True, user=self.user,
                       timeout=timeout_s, cwd=self.directory)  # fmt: skip

    def init(self) -> None:
        """Create the cluster and the ``botmesh`` database, and start it."""
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        self.start()
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "botmesh")

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.directory} -c fsync=off "
                   "-c max_connections=60")  # fmt: skip
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.directory / "postgres.log"), "-o", options,
                  "-w", "-t", "30", "start")  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: disconnect every client, as an operator's restart does)."""
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "30", "stop")

    def remove(self) -> None:
        """Stop the server if it runs and delete its files."""
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)


class Processes:
    """The processes and servers of one test; leaving the block stops all of them, in reverse order."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._stoppers: list[object] = []
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc: object) -> None:
        for stop in reversed(self._stoppers):
            with contextlib.suppress(Exception):
                stop()  # type: ignore[operator]

    def redis(self, *, appendonly: bool = True) -> RedisServer:
        """Start a Redis of this test's own."""
        server = RedisServer(self.directory / "redis", appendonly=appendonly)
        self._stoppers.append(server.stop)
        server.start()
        return server

    def postgres(self) -> PostgresServer:
        """Create and start a PostgreSQL of this test's own."""
        server = PostgresServer()
        self._stoppers.append(server.remove)
        server.init()
        return server

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Start ``argv`` (in its own process group, output in ``<dir>/<name>.log``) from the project root."""
        log = open(self.directory / f"{name}.log", "ab")  # noqa: SIM115 (the child's life)
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        log.close()
        self._stoppers.append(lambda: _stop(proc))
        self._procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        """Return what process ``name`` wrote so far."""
        path = self.directory / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_healthz(self, name: str, port: int, timeout_s: float = 60.0) -> None:
        """Wait until process ``name`` answers ``GET /healthz`` on ``port`` with 200 (gunicorn or runserver).

        Fail with its log when it exits first or ``timeout_s`` (seconds) pass.
        """
        import http.client

        proc = self._procs[name]
        deadline = time.monotonic() + timeout_s
        while True:
            assert proc.poll() is None, self.log(name)
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            try:
                conn.request("GET", "/healthz", headers={"Connection": "close"})
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            finally:
                conn.close()
            assert time.monotonic() < deadline, self.log(name)
            time.sleep(0.2)


def migrated_copy(path: Path) -> None:
    """Write the test run's migrated SQLite database to ``path`` (spares a started stack its ``migrate``)."""
    import sqlite3

    from django.db import connection

    connection.ensure_connection()
    target = sqlite3.connect(path)
    try:
        connection.connection.backup(target)
    finally:
        target.close()


FAULT_REPORT_DEFAULT = ROOT / "var" / "fault-report.txt"


def fault_report(line: str) -> None:
    """Print one ``FAULT <name>: <figures>`` line and append it to the fault report file.

    The file is ``$BOTMESH_FAULT_REPORT`` (``.ci/run`` sets it and prints the
    file after the suite, passed or failed), else ``var/fault-report.txt``.
    Tests call this before their assertions, so a failing run reports its figures too.
    """
    assert line.startswith("FAULT "), line
    print(line)
    path = Path(os.environ.get("BOTMESH_FAULT_REPORT") or FAULT_REPORT_DEFAULT)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as out:  # one short append per test (pytest-xdist workers share it)
        out.write(line.rstrip("\n") + "\n")


def python() -> str:
    """The interpreter of the test run (the project's venv)."""
    return sys.executable


def project_env(directory: Path) -> dict[str, str]:
    """The environment of a botmesh process: this one's, less its botmesh/Celery/Django settings.

    The data dir and an SQLite database go under ``directory``; a test adds
    the URLs of its own servers.
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("BOTMESH_", "CELERY_", "DJANGO_")) and k not in ("DATABASE_URL", "REDIS_URL")
    }
    env.update({
        "DJANGO_SETTINGS_MODULE": "botmesh_admin.settings", "BOTMESH_DATA_DIR": str(directory / "data"),
        "DATABASE_URL": f"sqlite:///{directory}/data/db.sqlite3", "OTEL_SDK_DISABLED": "true",
        "PYTHONUNBUFFERED": "1",
    })  # fmt: skip
    if os.environ.get("BOTMESH_FIXTURES"):
        env["BOTMESH_FIXTURES"] = os.environ["BOTMESH_FIXTURES"]
    return env
