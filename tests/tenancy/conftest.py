from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.contrib.auth import get_user_model

from botmesh_admin.tenancy import services


@dataclass
class World:
    """Two tenants, an admin and an agent in ``acme``, an admin in ``globex``, a token per tenant."""

    acme_token: str
    acme_agent_token: str
    globex_token: str


@pytest.fixture
def world(db) -> World:
    users = get_user_model()
    for name in ("alice", "bob", "carol"):
        users.objects.create_user(name, password=f"{name}-password-1")
    services.tenant_create("acme", name="ACME")
    services.tenant_create("globex", name="Globex")
    services.membership_set("acme", username="alice", role="admin")
    services.membership_set("acme", username="bob", role="agent")
    services.membership_set("globex", username="carol", role="admin")
    return World(
        acme_token=services.token_create("acme", name="ci")[1],
        acme_agent_token=services.token_create("acme", name="bot", role="agent")[1],
        globex_token=services.token_create("globex", name="ci")[1],
    )
