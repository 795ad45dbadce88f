"""The embedded broker in a Celery worker: ``drain_events`` returns to Celery's loop within ``worker_wait_s``.

Found by a new user: on ``./dev run`` a webhook's message reached the inbox 3 s after it, and a
minute on a busy machine. Celery runs the filesystem transport in its blocking loop, which waits in
``drain_events(timeout=2.0)`` and acks finished tasks only between two waits; with acks late and a
prefetch of one, the live worker took one task every two seconds. A worker now waits at most
``worker_wait_s``; any other caller keeps its own timeout (a control command collecting replies).
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from kombu import Connection

from botmesh_admin import filesystem_broker
from botmesh_admin.celery import FILESYSTEM_WORKER_WAIT_S


def _connection(tmp_path: Path) -> Connection:
    for name in ("queue", "processed", "control"):
        (tmp_path / name).mkdir()
    options = {
        "data_folder_in": str(tmp_path / "queue"), "data_folder_out": str(tmp_path / "queue"),
        "processed_folder": str(tmp_path / "processed"), "control_folder": str(tmp_path / "control"),
        "store_processed": False, "polling_interval": 0.05,
    }  # fmt: skip
    return Connection("filesystem://", transport="botmesh_admin.filesystem_broker:Transport", transport_options=options)


def _waited(conn: Connection, timeout: float) -> float:
    """Return how long an empty queue's ``drain_events(timeout)`` waited before its ``socket.timeout`` (seconds)."""
    with conn.SimpleQueue("probe"):
        start = time.monotonic()
        with pytest.raises(socket.timeout):
            conn.drain_events(timeout=timeout)
        return time.monotonic() - start


def test_in_a_worker_the_loop_gets_back_within_the_worker_wait(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(filesystem_broker.Transport, "worker_wait_s", FILESYSTEM_WORKER_WAIT_S)
    with _connection(tmp_path) as conn:
        waited = _waited(conn, 2.0)  # Celery's synloop asks for 2 s
    assert FILESYSTEM_WORKER_WAIT_S <= waited < 1.5, waited


def test_outside_a_worker_a_callers_timeout_is_kept(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(filesystem_broker.Transport, "worker_wait_s", None)  # the default: set when a worker starts
    with _connection(tmp_path) as conn:
        assert _waited(conn, 0.4) >= 0.4


def test_the_embedded_broker_names_no_host_and_does_not_warn_about_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # kombu's virtual transports default to "localhost" and warn at every connection that none was
    # given: a line in every ./dev run and worker start about a host this directory broker never uses.
    with caplog.at_level("WARNING", logger="kombu.connection"), _connection(tmp_path) as conn:
        info = conn.info()  # what Celery's start banner and every connection read
    assert not info["hostname"]
    assert [r.getMessage() for r in caplog.records if r.name == "kombu.connection"] == []
