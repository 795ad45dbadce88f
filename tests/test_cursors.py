"""Every paginated list answers alike: a malformed ``after`` is 422 naming it; one past the end, an empty page."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.test import Client

from botmesh_admin.events.services import journal_drain
from botmesh_admin.tenancy import services as tenancy
from tests.backends import unique_id
from tests.inbox.conftest import ledger_records

# The lists, each with a cursor of its shape that sorts past its last item.
LISTS = {
    "events": "ev_000000000000000000000000",
    "conversations": "0/cv_00000000000000000000",  # newest first: the oldest position
    "conversations/{conversation}/messages": "9999999999999/zzz",
    "conversations/{conversation}/notes": "n_9999999999999_99999999",
    "contacts": "c_ffffffffffffffffffffff",
    "campaigns": "cmp_ffffffffffffffffffffff",
    "campaigns/{campaign}/deliveries": "+999999999999999",
    "plugins": "zzz.zzz",
    "plugin-audit": "999999999999999-999999999999-ffffff",
    "plugins/acme.p1/audit": "999999999999999-999999999999-ffffff",
    "bots": "zzz",
    "bots/tienda-bot/versions": "0",
    "bots/tienda-bot/audit": "999999999999999-999999999999-ffffff",
    "traces": "r/9999999999999/ffffffffffffffffffffffffffffffff",
}
MALFORMED = ["XYZ", "not a cursor", "a/xyz/cv_1", "!!!", "-1", "Zm9vYmFy", "ev_XYZ", "\x00"]


@dataclass
class Shop:
    tenant: str
    client: Client
    ids: dict[str, str]

    def get(self, path: str, after: str):
        response = self.client.get(f"/api/v1/tenants/{self.tenant}/{path.format(**self.ids)}", {"after": after})
        return response.status_code, response.json()


@pytest.fixture
def shop(db) -> Shop:
    """A tenant with one conversation and one draft campaign, read with an admin token."""
    from campaigns.services import campaign_create
    from crm.services import segment_create

    tenant = unique_id("cursor")
    tenancy.tenant_create(tenant, name="Cursor")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {tenancy.token_create(tenant, name='ci')[1]}")
    record = dict(next(r for r in ledger_records() if r["channel"] == "whatsapp"), tenantId=None)
    assert client.post(f"/api/v1/tenants/{tenant}/ledger", [record], content_type="application/json").status_code == 202
    while sum(journal_drain(channel="ledger", limit=500).values()):
        pass
    [conversation] = client.get(f"/api/v1/tenants/{tenant}/conversations").json()["items"]
    segment = segment_create(tenant, name="All", rules={})
    campaign = campaign_create(
        tenant,
        name="Promo",
        segment_id=segment.id,
        channel="whatsapp",
        message={"template": "promo_nov", "language": "es", "parameters": []},
    )
    return Shop(tenant, client, {"conversation": conversation["id"], "campaign": campaign.id})


@pytest.mark.parametrize("path", sorted(LISTS))
def test_a_malformed_cursor_is_422_naming_after_on_every_list(shop: Shop, path: str) -> None:
    """Found by exploratory testing: lists answered a bad ``after`` with the first page, an empty page or 422."""
    for after in MALFORMED:
        status, body = shop.get(path, after)
        assert (status, body.get("field")) == (422, "after"), (after, body)


@pytest.mark.parametrize("path", sorted(LISTS))
def test_a_well_formed_cursor_past_the_end_is_an_empty_page_on_every_list(shop: Shop, path: str) -> None:
    """Found by exploratory testing (the other half of the rule: a cursor of the right shape is never refused)."""
    status, body = shop.get(path, LISTS[path])
    assert (status, body["items"], body["next"]) == (200, [], None), body
