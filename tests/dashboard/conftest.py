"""Fixtures of the dashboard tests: members of a tenant and an isolated coordination state."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from botmesh_admin.coordination.base import bot_prefix
from botmesh_admin.coordination.bots import use_bot_backends
from botmesh_admin.coordination.memory import MemoryCoordinationHub, MemoryCoordinator
from botmesh_admin.coordination.runtime import use_coordinator
from botmesh_admin.events import connect_journal, use_journal
from botmesh_admin.kv.memory import MemoryKv
from botmesh_admin.kv.runtime import use_kv
from botmesh_admin.tenancy import services as tenancy


@pytest.fixture
def members(db) -> None:  # type: ignore[no-untyped-def]
    users = get_user_model()
    users.objects.create_user("alice", password="alice-password-1")
    users.objects.create_user("bob", password="bob-password-1")
    users.objects.create_user("eve", password="eve-password-1")
    users.objects.create_superuser("root", password="root-password-1")  # the installation's operator
    tenancy.tenant_create("tienda", name="Tienda")
    tenancy.tenant_create("otra", name="Otra")
    tenancy.membership_set("tienda", username="alice", role="admin")
    tenancy.membership_set("tienda", username="bob", role="agent")
    tenancy.membership_set("otra", username="eve", role="admin")


def client_for(username: str) -> Client:
    client = Client()
    assert client.login(username=username, password=f"{username}-password-1")
    return client


@pytest.fixture
def hub() -> MemoryCoordinationHub:
    return MemoryCoordinationHub()


@pytest.fixture
def web(hub: MemoryCoordinationHub) -> Iterator[MemoryCoordinator]:
    """The web process's own coordinator (what the pages read), over ``hub``."""
    coordinator = MemoryCoordinator(hub, "web-1", lease_ms=5000, role="web")
    with use_coordinator(coordinator):
        yield coordinator
    coordinator.close()


@pytest.fixture
def isolated() -> Iterator[tuple[MemoryKv, object]]:
    """A fresh Kv and journal for the test (the process defaults are shared)."""
    kv, journal = MemoryKv("memory://"), connect_journal("memory://")
    with use_kv(kv), use_journal(journal):
        yield kv, journal
    journal.close()


class BotHubs:
    """One in-process hub per bot prefix; ``replica`` starts a bot replica under ``(tenant, bot)``."""

    def __init__(self) -> None:
        self.hubs: dict[str, MemoryCoordinationHub] = {}
        self.made: list[MemoryCoordinator] = []

    def hub(self, prefix: str) -> MemoryCoordinationHub:
        return self.hubs.setdefault(prefix, MemoryCoordinationHub())

    def replica(self, tenant: str, bot: str, replica_id: str, lease_ms: int = 1500) -> MemoryCoordinator:
        coordinator = MemoryCoordinator(self.hub(bot_prefix(tenant, bot)), replica_id, lease_ms=lease_ms, role="bot")
        self.made.append(coordinator)
        return coordinator


@pytest.fixture
def bots(web) -> Iterator[BotHubs]:  # type: ignore[no-untyped-def]
    hubs = BotHubs()
    with use_bot_backends(hubs.hub):
        yield hubs
    for coordinator in hubs.made:
        coordinator.close(release=False)
