"""A list page refuses a filter value or cursor its address cannot mean: 400 with a readable page.

Found by a new user: ``/t/{t}/inbox/?status=bogus``, ``/t/{t}/campaigns/?state=bogus``
and ``/t/{t}/crm/contacts/?after=garbage`` answered 200 (an unfiltered or empty
list, as if the address were valid), while the API refuses such values with 422.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from botmesh_admin.tenancy import services as tenancy
from tests.backends import unique_id


@pytest.fixture
def member(db) -> tuple[str, Client]:
    tenant = unique_id("lists")
    tenancy.tenant_create(tenant, name="Lists")
    user = get_user_model().objects.create_user(unique_id("agent"), password="pw-agent-123")
    tenancy.membership_set(tenant, username=user.username, role="agent")
    client = Client()
    client.force_login(user)
    return tenant, client


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("inbox/?status=bogus", "status"),
        ("inbox/?channel=fax", "channel"),
        ("inbox/?view=everything", "view"),
        ("inbox/?after=garbage", "after"),
        ("inbox/_list?status=bogus", "status"),
        ("campaigns/?state=bogus", "state"),
        ("campaigns/?after=not%20an%20id", "after"),
        ("crm/contacts/?after=garbage", "after"),
    ],
)
def test_a_bad_filter_or_cursor_is_a_400_page_naming_it(member, path, field):
    tenant, client = member
    response = client.get(f"/t/{tenant}/{path}")
    html = response.content.decode()
    assert response.status_code == 400, path
    assert "<html" in html.lower() and 'role="alert"' in html
    assert f"{field}:" in html or f"{field} " in html, html[-2000:]


@pytest.mark.parametrize(
    "path",
    [
        "inbox/?status=open&channel=whatsapp&view=mine",
        "inbox/?channel=telegram/help",
        "campaigns/?state=running",
        "crm/contacts/",
    ],
)
def test_valid_filters_still_list(member, path):
    tenant, client = member
    assert client.get(f"/t/{tenant}/{path}").status_code == 200, path


def test_the_campaign_list_filters_by_state(member):
    tenant, client = member
    html = client.get(f"/t/{tenant}/campaigns/?state=running").content.decode()
    assert "No running campaigns" in html
