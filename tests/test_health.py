"""/healthz (alive) and /readyz (dependencies reachable; 503 naming what is not)."""

from __future__ import annotations

import pytest
from django.test import Client

from botmesh_admin.kv.memory import MemoryKv
from botmesh_admin.kv.runtime import use_kv
from botmesh_admin.observability import health


def test_healthz_is_alive(client: Client) -> None:
    resp = client.get("/healthz")
    assert resp.status_code == 200 and resp.json() == {"status": "alive"}


@pytest.mark.django_db
def test_readyz_reports_each_dependency(client: Client) -> None:
    resp = client.get("/readyz")
    assert resp.status_code == 200
    assert resp.json()["checks"]["database"] == "ok"
    assert resp.json()["checks"]["kv"] == "ok"


class _DownKv(MemoryKv):
    def ping(self) -> None:
        raise ConnectionError("connection refused")


@pytest.mark.django_db
def test_readyz_names_what_is_unreachable(client: Client) -> None:
    with use_kv(_DownKv()):
        resp = client.get("/readyz")
    assert resp.status_code == 503
    assert resp.json()["reason"] == "kv unreachable (ConnectionError: connection refused)"


@pytest.mark.django_db
def test_readyz_is_503_while_stopping(client: Client) -> None:
    health.mark_stopping()
    try:
        resp = client.get("/readyz")
        assert resp.status_code == 503 and resp.json()["status"] == "stopping"
    finally:
        health._stopping.clear()
