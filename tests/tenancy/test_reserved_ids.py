"""Issue 15 item 8: no tenant id can name the kernel's own tables.

Before: ``botmesh_tenant create system`` was accepted, and the campaigns'
cross-tenant due-index lived in ``campaigns/system/index``, the table name a
tenant ``system`` gets for its collection ``index``.
"""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client

from botmesh_admin.errors import ValidationError
from botmesh_admin.kv import Put, TenantKv
from botmesh_admin.kv.runtime import use_kv
from botmesh_admin.tenancy.models import Tenant
from campaigns.stores.kv import KvCampaignStore
from tests.backends import unique_id


@pytest.mark.django_db
def test_create_tenant_system_is_refused_naming_the_field():
    with pytest.raises(CommandError) as caught:
        call_command("botmesh_tenant", "create", "system", stdout=io.StringIO())
    assert str(caught.value).startswith("tenant.id: 'system' is reserved")
    assert not Tenant.objects.filter(id="system").exists()


@pytest.mark.django_db
def test_api_refuses_a_reserved_tenant_even_if_an_old_version_created_it():
    Tenant.objects.create(id="system", name="left by an earlier version")
    get_user_model().objects.create_superuser("root", password="root-password-1")
    client = Client()
    client.login(username="root", password="root-password-1")
    response = client.get("/api/v1/tenants/system/whoami")
    assert response.status_code == 422
    assert response.json()["field"] == "tenant"
    assert "reserved" in response.json()["message"]


def test_no_tenant_id_reaches_a_kernel_table(any_kv):
    """The due-index is ``campaigns/~system/index``; a tenant ``system`` cannot even be named."""
    store = KvCampaignStore(any_kv)
    tenant = unique_id()
    store.index_put(tenant, "cmp_a", state="scheduled", at=5)
    assert any_kv.get("campaigns/~system/index", f"{tenant}!cmp_a") is not None
    with pytest.raises(ValidationError, match="^tenant: 'system' is reserved"):
        TenantKv(any_kv, "campaigns").table("system", "index")
    store.index_delete(tenant, "cmp_a")


@pytest.mark.django_db
def test_upgrade_moves_the_index_of_an_earlier_version(any_kv):
    """Entries in ``campaigns/system/index`` are moved by ``botmesh_upgrade`` (and by a tick)."""
    store = KvCampaignStore(any_kv)
    tenant = unique_id()
    legacy = "campaigns/system/index"
    any_kv.commit(legacy, [Put(f"{tenant}!cmp_old", {"state": "scheduled", "at": 7})])
    store.index_put(tenant, "cmp_new", state="running", at=None)
    any_kv.commit(legacy, [Put(f"{tenant}!cmp_new", {"state": "scheduled", "at": 1})])  # older than the new one
    out = io.StringIO()
    with use_kv(any_kv):
        call_command("botmesh_upgrade", stdout=out)
        call_command("botmesh_upgrade", stdout=io.StringIO())  # idempotent
    assert "entries moved to campaigns/~system/index" in out.getvalue()
    assert not [e for e in any_kv.scan(legacy, limit=1000) if e.key.startswith(tenant)]
    mine = {e.campaign_id: e.state for e in store.index_scan(after=(tenant, ""), limit=10) if e.tenant == tenant}
    assert mine == {"cmp_old": "scheduled", "cmp_new": "running"}
    any_kv.commit(legacy, [Put(f"{tenant}!cmp_late", {"state": "scheduled", "at": 9})])  # an old process, mid-upgrade
    store.index_scan(limit=1)  # a tick's first page
    assert any_kv.get("campaigns/~system/index", f"{tenant}!cmp_late") is not None
    assert any_kv.get(legacy, f"{tenant}!cmp_late") is None
    for campaign in ("cmp_old", "cmp_new", "cmp_late"):
        store.index_delete(tenant, campaign)


@pytest.mark.django_db
def test_api_answers_a_malformed_tenant_id_422_naming_it_and_the_format_as_a_reserved_one():
    """Before: ``/api/v1/tenants/BAD!/whoami`` was a 404 "tenant 'BAD!' not found", a reserved id a 422."""
    from botmesh_admin.tenancy import services as tenancy

    get_user_model().objects.create_superuser("root", password="root-password-1")
    session = Client()
    session.login(username="root", password="root-password-1")
    tenant = unique_id()
    tenancy.tenant_create(tenant, name="Tienda")
    _, plaintext = tenancy.token_create(tenant, name="t", role="admin")
    bearer = Client(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    for client in (session, bearer):
        for bad in ("BAD!", "Tienda", "-x"):
            response = client.get(f"/api/v1/tenants/{bad}/whoami")
            assert response.status_code == 422, (bad, response.content)
            body = response.json()
            assert body["field"] == "tenant" and repr(bad) in body["message"], body
            assert "1-63 characters of a-z, 0-9" in body["message"], body
    assert bearer.get(f"/api/v1/tenants/{tenant}/whoami").status_code == 200


@pytest.mark.django_db
def test_no_member_can_be_named_as_an_api_token_acts() -> None:
    """``token-<id>`` is the agent id of an API token (its notes, handoffs, read markers): a user of that name
    would share them, and the pages would name the token for them."""
    from botmesh_admin.tenancy import services

    tenant = unique_id("shop")
    services.tenant_create(tenant, name="Shop")
    for name in ("token-7", "token-0042"):
        get_user_model().objects.create_user(name, password="pw-token-like-123")
        with pytest.raises(ValidationError) as refused:
            services.membership_set(tenant, username=name, role="agent")
        assert refused.value.field == "membership.username" and "API tokens" in refused.value.message
    get_user_model().objects.create_user("token-maria", password="pw-token-like-123")
    assert services.membership_set(tenant, username="token-maria", role="agent").role == "agent"
    assert [m.user.username for m in services.Membership.objects.filter(tenant_id=tenant)] == ["token-maria"]
