"""``contact_blocked_us``: the one CRM service recording "the user blocked us" (consent denied, with evidence)."""

from __future__ import annotations

import pytest

from botmesh_admin.errors import ValidationError
from crm import selectors, services


def test_the_contact_holding_the_identity_gets_its_consent_denied_with_the_evidence(memory_crm: str) -> None:
    sofia = services.contact_upsert_identity(memory_crm, channel="telegram", address="700000001", source="inbox")
    services.consent_set(memory_crm, sofia.id, channel="telegram", status="granted", source="import")
    got = services.contact_blocked_us(
        memory_crm, channel="telegram", identity="700000001", evidence="Forbidden: " + "x" * 600, source="inbox"
    )
    assert got is not None and got.id == sofia.id
    consent = selectors.contact_get(memory_crm, sofia.id).consent["telegram"]
    assert (consent.status, consent.source) == ("denied", "inbox")
    assert consent.evidence.startswith("Forbidden: x") and len(consent.evidence) == 500 and consent.evidence[-1] == "…"
    default = services.contact_blocked_us(memory_crm, channel="telegram", identity="700000001", evidence="again")
    assert default.consent["telegram"].source == "inbox", "already denied: nothing written"


def test_an_identity_nobody_holds_is_none_and_bad_input_names_the_field(memory_crm: str) -> None:
    assert services.contact_blocked_us(memory_crm, channel="telegram", identity="700000009", evidence="403") is None
    with pytest.raises(ValidationError) as bad:
        services.contact_blocked_us(memory_crm, channel="telegram", identity="not a user id", evidence="403")
    assert bad.value.field == "identity"
    with pytest.raises(ValidationError) as bad:
        services.contact_blocked_us(memory_crm, channel="sms", identity="700000001", evidence="403")
    assert bad.value.field == "channel"
    with pytest.raises(ValidationError) as bad:
        services.contact_blocked_us(memory_crm, channel="telegram", identity="700000001", evidence=" ")
    assert bad.value.field == "evidence"
