"""Fixtures of the hub tests: the PluginStore over memory and over every Kv backend."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from botmesh_admin.demo import fixtures_dir
from hub.domain import RuntimeInfo
from hub.stores import use_store
from hub.stores.base import PluginStore
from hub.stores.kv import KvPluginStore
from hub.stores.memory import MemoryPluginStore
from tests.stores import store_fixture

RUNTIME = RuntimeInfo(
    version="1.6.2",
    known_permissions=(
        "messages:read",
        "messages:send",
        "contacts:read",
        "contacts:write",
        "http:fetch",
        "storage:read",
        "storage:write",
        "schedule:write",
    ),
)


plugin_store = store_fixture("plugin_store", memory=MemoryPluginStore, kv=KvPluginStore)


@pytest.fixture
def hub(plugin_store: PluginStore) -> Iterator[PluginStore]:
    """``plugin_store`` as the hub's store (``use_store``) for the test; the runtime is the shipped 1.6.2."""
    with use_store(plugin_store):
        yield plugin_store


@pytest.fixture(scope="session")
def hub_fixtures() -> Path:
    """``fixtures/hub`` (read-only)."""
    return fixtures_dir() / "hub"


@pytest.fixture(scope="session")
def order_status(hub_fixtures: Path) -> bytes:
    """order-status 1.4.0 (four permissions)."""
    return (hub_fixtures / "valid" / "order-status.json").read_bytes()


@pytest.fixture(scope="session")
def order_status_more(hub_fixtures: Path) -> bytes:
    """order-status 1.5.0: 1.4.0's permissions plus contacts:write."""
    return (hub_fixtures / "valid" / "order-status-1.5.0-more-perms.json").read_bytes()


@dataclass
class World:
    """Tenant ``a`` (admin + agent tokens, users ``ana`` admin / ``bo`` agent) and tenant ``b`` (admin token)."""

    a: str
    b: str
    admin: dict[str, str]
    agent: dict[str, str]
    b_admin: dict[str, str]


def bearer(token: str) -> dict[str, str]:
    """Return the Django test client kwargs of an API token."""
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
