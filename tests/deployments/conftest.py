"""Fixtures of the deployments tests: the DeploymentStore over memory and every Kv backend."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from botmesh_admin.demo import fixtures_dir
from deployments.services import DeploymentRegistry
from deployments.stores.base import DeploymentStore
from deployments.stores.kv import KvDeploymentStore
from deployments.stores.memory import MemoryDeploymentStore
from tests import backends

STORES = ["memory-store", *(f"kv-{name}" for name in backends.KV_BACKENDS)]
GATES = ("unit-tests", "conversation-replay", "manual-approval")


class Clock:
    """A settable epoch-millisecond clock."""

    def __init__(self, now: int = 1_700_000_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def open_store(name: str, request: pytest.FixtureRequest) -> DeploymentStore:
    """Return a fresh store: the reference memory store, or the Kv store on one backend."""
    if name == "memory-store":
        return MemoryDeploymentStore()
    return KvDeploymentStore(backends.open_kv(name.removeprefix("kv-"), request))


@pytest.fixture(params=STORES)
def deployment_store(request: pytest.FixtureRequest) -> DeploymentStore:
    """A fresh DeploymentStore of each implementation in turn (use the ``tenant_id`` fixture)."""
    return open_store(request.param, request)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def registry(deployment_store: DeploymentStore, clock: Clock) -> DeploymentRegistry:
    """A DeploymentRegistry over ``deployment_store`` with a settable clock, keeping every version."""
    return DeploymentRegistry(deployment_store, clock=clock)


@pytest.fixture(scope="session")
def versions() -> list[dict[str, Any]]:
    """The five fixture versions of tienda-bot, oldest first (the last a pre-release)."""
    folder = fixtures_dir() / "deployments"
    return [json.loads((folder / f"version_{i}.json").read_text()) for i in range(1, 6)]


def pass_gates(registry: DeploymentRegistry, tenant: str, version: str, result: str = "succeeded") -> None:
    """Run every gate of ``version`` to ``result``."""
    for gate in GATES:
        run = registry.start_gate_run(tenant, "tienda-bot", version, gate, actor="ci")
        registry.finish_gate_run(tenant, "tienda-bot", version, gate, run_id=run.run_id, result=result, actor="ci")


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
