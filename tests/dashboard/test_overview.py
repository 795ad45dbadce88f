"""The tenant overview shows each package's headline number, only to roles that may see it."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from botmesh_admin.tenancy import services as tenancy
from crm import services as crm

pytestmark = pytest.mark.django_db


@pytest.fixture
def acme() -> None:
    users = get_user_model()
    users.objects.create_user("olga", password="olga-password-1")
    users.objects.create_user("ivan", password="ivan-password-1")
    tenancy.tenant_create("acme", name="ACME")
    tenancy.membership_set("acme", username="olga", role="admin")
    tenancy.membership_set("acme", username="ivan", role="agent")


def _cards(client: Client) -> dict[str, str]:
    html = client.get("/t/acme/").content.decode()
    import re

    return dict(
        re.findall(
            r'data-testid="card-([a-z]+)">\s*<span class="overview-title">[^<]*</span>\s*'
            r'<span class="overview-value[^"]*">([^<]*)</span>',
            html,
        )
    )


def test_admin_sees_counts_of_every_package(acme) -> None:
    crm.contact_upsert_identity("acme", channel="whatsapp", address="+573001112233", name="Ana", source="test")
    crm.contact_upsert_identity("acme", channel="whatsapp", address="57 300 111 2233", name="Ana", source="test")
    crm.contact_upsert_identity("acme", channel="email", address="bo@example.com", name="Bo", source="test")
    client = Client()
    client.login(username="olga", password="olga-password-1")
    cards = _cards(client)
    assert cards["contacts"] == "2"  # one phone written two ways is one contact
    assert cards["plugins"] == "0/0"
    assert cards["journal"] == "0"
    assert set(cards) == {"inbox", "contacts", "campaigns", "plugins", "deployments", "journal"}


def test_agent_sees_only_agent_cards(acme) -> None:
    client = Client()
    client.login(username="ivan", password="ivan-password-1")
    assert set(_cards(client)) == {"inbox", "contacts"}
