"""Brazil's mobile ninth digit (issue 15, item 11): a WhatsApp ``wa_id`` without the 9 and a CSV
row with it are one contact.

Before: ``551181234567`` (the wa_id of an account made before Anatel's ninth
digit) became ``+551181234567`` and the CSV's ``+55 11 98123-4567`` a second
contact, ``+5511981234567``; the same person was messaged twice by a campaign.
"""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from botmesh_admin.demo import fixtures_dir
from crm.domain import normalize_identity
from tests.crm.test_api import eager_celery  # noqa: F401  (a fixture)
from tests.inbox.test_webhooks_and_replies import conversation, drain, shop  # noqa: F401  (a fixture)

WA_ID = "551181234567"  # São Paulo mobile, registered on WhatsApp before 2012: no ninth digit


@pytest.mark.parametrize("address", [WA_ID, "+55 11 8123-4567", "+55 11 98123-4567", "5511981234567"])
def test_brazilian_mobile_with_or_without_the_ninth_digit_is_one_number(address: str) -> None:
    assert normalize_identity("whatsapp", address) == "+5511981234567"


@pytest.mark.parametrize(
    ("address", "e164"),
    [
        ("551131234567", "+551131234567"),  # a landline keeps 8 digits
        ("+52 1 55 1234 5678", "+525512345678"),
    ],
)
def test_landlines_and_other_countries_are_left_alone(address: str, e164: str) -> None:
    assert normalize_identity("whatsapp", address) == e164


def _signed_message_from(shop, wa_id: str) -> int:  # type: ignore[no-untyped-def]  # noqa: F811
    body = json.loads((fixtures_dir() / "whatsapp" / "raw" / "01_text.json").read_text())
    value = body["entry"][0]["changes"][0]["value"]
    value["contacts"][0]["wa_id"] = value["messages"][0]["from"] = wa_id
    value["contacts"][0]["profile"]["name"] = "João Silva"
    value["messages"][0]["id"] = "wamid.BR-ninth-digit-1"
    raw = json.dumps(body).encode()
    secret = json.loads((fixtures_dir() / "whatsapp" / "raw" / "signatures.json").read_text())["app_secret"]
    signature = "sha256=" + hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()
    return shop.client.post(
        f"/webhooks/whatsapp/{shop.tenant}",
        data=raw,
        content_type="application/json",
        HTTP_X_HUB_SIGNATURE_256=signature,
    ).status_code


def test_webhook_sender_without_the_nine_and_csv_row_with_it_are_one_contact(shop, eager_celery) -> None:  # noqa: F811
    assert _signed_message_from(shop, WA_ID) == 200
    drain()
    conv = conversation(shop, f"whatsapp:{WA_ID}")
    assert conv.contact_id is not None
    csv = "name,phone,tags\nJoão Silva,+55 11 98123-4567,vip\n".encode()
    response = shop.client.post(
        f"/api/v1/tenants/{shop.tenant}/contacts/imports",
        csv,
        content_type="text/csv",
        HTTP_AUTHORIZATION=f"Bearer {shop.token}",
        HTTP_X_FILENAME="br.csv",
    )
    assert response.status_code == 202, response.content
    _, job = shop.api("get", f"contacts/imports/{response.json()['id']}")
    assert (job["status"], job["created"], job["merged"]) == ("done", 0, 1)
    _, page = shop.api("get", "contacts?limit=200")
    assert [(c["id"], c["tags"], [i["address"] for i in c["identities"]]) for c in page["items"]] == [
        (conv.contact_id, ["vip"], ["+5511981234567"])
    ]
