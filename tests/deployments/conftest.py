"""Fixtures of the deployments tests: the DeploymentStore over memory and every Kv backend."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from botmesh_admin.clock import FakeClock, use_clock
from botmesh_admin.demo import fixtures_dir
from deployments import services
from deployments.stores import use_store
from deployments.stores.base import DeploymentStore
from deployments.stores.kv import KvDeploymentStore
from deployments.stores.memory import MemoryDeploymentStore
from tests.stores import store_fixture

GATES = ("unit-tests", "conversation-replay", "manual-approval")


deployment_store = store_fixture("deployment_store", memory=MemoryDeploymentStore, kv=KvDeploymentStore)


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    """The kernel clock fixed at 2023-11-14 (``use_clock``); move it with ``advance``."""
    with use_clock(FakeClock()) as fake:
        yield fake


@pytest.fixture
def registry(deployment_store: DeploymentStore, clock: FakeClock) -> Iterator[DeploymentStore]:
    """``deployment_store`` as the deployments store (``use_store``) on the fake ``clock``, keeping every version."""
    with use_store(deployment_store):
        yield deployment_store


@pytest.fixture(scope="session")
def versions() -> list[dict[str, Any]]:
    """The five fixture versions of tienda-bot, oldest first (the last a pre-release)."""
    folder = fixtures_dir() / "deployments"
    return [json.loads((folder / f"version_{i}.json").read_text()) for i in range(1, 6)]


def pass_gates(tenant: str, version: str, result: str = "succeeded") -> None:
    """Run every gate of ``version`` to ``result``."""
    for gate in GATES:
        run = services.gate_run_start(tenant, "tienda-bot", version, gate, actor="ci")
        services.gate_run_finish(tenant, "tienda-bot", version, gate, run_id=run.run_id, result=result, actor="ci")


@dataclass
class World:
    """Tenant ``a`` (admin + agent tokens, users ``ana`` admin / ``bo`` agent) and tenant ``b`` (admin token)."""

    a: str
    b: str
    admin: dict[str, str]
    agent: dict[str, str]
    b_admin: dict[str, str]


def bearer(token: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


@pytest.fixture
def world(db, tenant_id: str) -> World:
    """Two fresh tenants with tokens (the Kv is per process, so the ids are unique per test)."""
    from django.contrib.auth import get_user_model

    from botmesh_admin.tenancy import services

    a, b = tenant_id, tenant_id + "-b"
    users = get_user_model()
    users.objects.create_user("ana", password="ana-password-1")
    users.objects.create_user("bo", password="bo-password-1")
    services.tenant_create(a, name="Tenant A")
    services.tenant_create(b, name="Tenant B")
    services.membership_set(a, username="ana", role="admin")
    services.membership_set(a, username="bo", role="agent")
    return World(
        a=a,
        b=b,
        admin=bearer(services.token_create(a, name="ci", role="admin")[1]),
        agent=bearer(services.token_create(a, name="bot", role="agent")[1]),
        b_admin=bearer(services.token_create(b, name="ci", role="admin")[1]),
    )
