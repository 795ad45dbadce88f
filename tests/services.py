"""Real PostgreSQL and Redis servers for the test suite.

URLs come from the environment (``.ci/run`` and ``scripts/services.sh`` export
them). A test that needs a missing server is skipped with the reason; with
``BOTMESH_REQUIRE_SERVICES=1`` the skip becomes a failure (ARCHITECTURE §4).

The Redis Cluster (three local masters) is started once by the pytest
controller process when ``redis-server`` is on the PATH, and shared by every
xdist worker through ``BOTMESH_TEST_REDIS_CLUSTER_URL``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

REQUIRE = os.environ.get("BOTMESH_REQUIRE_SERVICES") == "1"


def need(env_var: str, what: str) -> str:
    """Return the URL in ``env_var`` or skip (fail under BOTMESH_REQUIRE_SERVICES=1)."""
    url = os.environ.get(env_var)
    if url:
        return url
    reason = f"{what} not available: set {env_var} (scripts/services.sh does)"
    if REQUIRE:
        pytest.fail(f"BOTMESH_REQUIRE_SERVICES=1 but {reason}")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisCluster:
    """Three local Redis masters forming a cluster (cluster-replicas 0)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="botmesh-cluster-"))
        self.ports: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> str:
        # Cluster bus port is port+10000: pick ports whose bus ports are free too.
        while len(self.ports) < 3:
            port = _free_port()
            if port < 55000 and port not in self.ports:
                self.ports.append(port)
        for port in self.ports:
            node_dir = self.dir / str(port)
            node_dir.mkdir()
            self.procs.append(
                subprocess.Popen(
                    [
                        "redis-server",
                        "--port",
                        str(port),
                        "--bind",
                        "127.0.0.1",
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "2000",
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--dir",
                        str(node_dir),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        for port in self.ports:
            self._wait(lambda p=port: self._cli(p, "ping") == "PONG")
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *[f"127.0.0.1:{p}" for p in self.ports],
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=30,
        )
        for port in self.ports:
            self._wait(lambda p=port: "cluster_state:ok" in self._cli(p, "cluster", "info"))
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    @staticmethod
    def _cli(port: int, *args: str) -> str:
        r = subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True)
        return r.stdout.strip()

    @staticmethod
    def _wait(ready, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(0.1)
        raise RuntimeError("redis cluster did not become ready")

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def start_cluster_if_possible() -> RedisCluster | None:
    """Start the shared cluster unless one is configured or redis-server is missing."""
    if os.environ.get("BOTMESH_TEST_REDIS_CLUSTER_URL") or not shutil.which("redis-server"):
        return None
    cluster = RedisCluster()
    try:
        os.environ["BOTMESH_TEST_REDIS_CLUSTER_URL"] = cluster.start()
    except Exception:
        cluster.stop()
        if REQUIRE:
            raise
        return None
    return cluster
