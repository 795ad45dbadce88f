"""Two tenants with users and API tokens, for the package tests that drive the HTTP surface.

A conftest takes the fixture by importing it: ``from tests.tenants import World, bearer, world``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest


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
