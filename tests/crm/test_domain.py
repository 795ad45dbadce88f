"""Identity normalisation, attribute and tag rules, strict segment matching."""

from __future__ import annotations

from dataclasses import replace

import pytest

from botmesh_admin.errors import ValidationError
from crm.domain import (
    Consent,
    Contact,
    Identity,
    normalize_identities,
    normalize_identity,
    normalize_tags,
    rules_match,
    segment_rules_from_input,
    strict_equal,
    validate_attributes,
)


@pytest.mark.parametrize(
    "address",
    [
        "+573001112233",
        "57 300 111 2233",
        "573001112233",
        "300 111 2233",
        "(300) 111-2233",
        "+57 300-111-2233",
        " +57 (300) 111 2233 ",
    ],
)
def test_one_colombian_phone_written_many_ways_is_one_e164(address: str) -> None:
    assert normalize_identity("whatsapp", address) == "+573001112233"


def test_digits_only_wa_id_is_read_as_international_even_in_another_region() -> None:
    assert normalize_identity("whatsapp", "14155550100", "CO") == "+14155550100"
    assert normalize_identity("whatsapp", "573001112233", "US") == "+573001112233"


@pytest.mark.parametrize(
    "address", ["5215512345678", "+5215512345678", "+52 1 55 1234 5678", "+525512345678", "525512345678"]
)
def test_mexican_mobile_wa_id_with_the_legacy_1_is_the_current_e164(address: str) -> None:
    """Found by exploratory testing: WhatsApp's wa_id 5215512345678 was refused (Mexico dropped the 1 in 2019)."""
    assert normalize_identity("whatsapp", address) == "+525512345678"


def test_national_number_follows_the_default_region() -> None:
    assert normalize_identity("whatsapp", "(415) 555-0100", "US") == "+14155550100"
    assert normalize_identity("whatsapp", "91 123 45 67", "ES") == "+34911234567"


@pytest.mark.parametrize("address", ["not-a-phone", "12", "+57 300 111 2233 ext x", "call 3001112233", ""])
def test_bad_phone_is_refused_naming_the_field(address: str) -> None:
    with pytest.raises(ValidationError) as info:
        normalize_identity("whatsapp", address, field="contact.identities[1].address")
    assert info.value.field == "contact.identities[1].address"


def test_telegram_id_is_digits_and_email_is_lower_case() -> None:
    assert normalize_identity("telegram", " 0700001004 ") == "700001004"
    assert normalize_identity("telegram", 700001004) == "700001004"
    assert normalize_identity("email", " Ana@Example.COM ") == "ana@example.com"
    # 4,301 digits: more than Python reads as an integer (a ValueError was a 500 and failed a CSV import)
    for bad in ("-5", "12ab", "0", "9" * 4301, "0" * 21 + "5"):
        with pytest.raises(ValidationError, match="Telegram"):
            normalize_identity("telegram", bad)
    for bad in ("broken@example", "no-at.example.com", "a@b@c.com", "ana @example.com"):
        with pytest.raises(ValidationError, match="email"):
            normalize_identity("email", bad)


def test_unknown_channel_names_the_channel_field() -> None:
    with pytest.raises(ValidationError) as info:
        normalize_identities([{"channel": "sms", "address": "1"}], "CO")
    assert info.value.field == "contact.identities[0].channel"


def test_identities_are_deduplicated_after_normalisation() -> None:
    out = normalize_identities(
        [
            {"channel": "whatsapp", "address": "+573001112233"},
            {"channel": "whatsapp", "address": "57 300 111 2233"},
            {"channel": "email", "address": "A@x.co"},
        ],
        "CO",
    )
    assert out == (Identity("whatsapp", "+573001112233"), Identity("email", "a@x.co"))


def test_attribute_names_and_values() -> None:
    assert validate_attributes({"plan": "pro", "age": 31, "ratio": 0.5, "vip": True, "note": None}) == {
        "age": 31,
        "note": None,
        "plan": "pro",
        "ratio": 0.5,
        "vip": True,
    }
    for bad, field in (
        ({"Plan": 1}, "contact.attributes.Plan"),
        ({"1x": 1}, "contact.attributes.1x"),
        ({"a": [1]}, "contact.attributes.a"),
        ({"a": float("nan")}, "contact.attributes.a"),
        ({"a" * 65: 1}, f"contact.attributes.{'a' * 65}"),
    ):
        with pytest.raises(ValidationError) as info:
            validate_attributes(bad)
        assert info.value.field == field


def test_tags_are_normalised_sorted_and_unique() -> None:
    assert normalize_tags(["VIP", " vip ", "nuevo cliente", "b2b"]) == ("b2b", "nuevo cliente", "vip")
    with pytest.raises(ValidationError) as info:
        normalize_tags(["ok", "-bad"])
    assert info.value.field == "contact.tags[1]"


def test_strict_equality_keeps_json_types_apart() -> None:
    assert not strict_equal("1", 1)
    assert not strict_equal(True, 1)
    assert not strict_equal(False, 0)
    assert not strict_equal(None, "")
    assert strict_equal(1, 1.0)
    assert strict_equal(True, True)


def _contact(**kw) -> Contact:
    return Contact(id="c_" + "0" * 22, **kw)


def test_segment_rules_match_tags_attributes_and_consent() -> None:
    c = _contact(
        identities=(Identity("whatsapp", "+573001112233"),),
        tags=("vip", "nuevo"),
        attributes={"score": 1, "active": True, "plan": "1"},
    )
    c = c.with_consent(Consent("whatsapp", "granted", 1, "test"))
    rules = segment_rules_from_input
    assert rules_match(rules({"tags_all": ["vip", "nuevo"]}), c)
    assert not rules_match(rules({"tags_all": ["vip", "moroso"]}), c)
    assert rules_match(rules({"tags_any": ["moroso", "vip"]}), c)
    assert not rules_match(rules({"tags_none": ["nuevo"]}), c)
    assert rules_match(rules({"attributes": {"score": 1}}), c)
    assert not rules_match(rules({"attributes": {"score": "1"}}), c)
    assert not rules_match(rules({"attributes": {"active": 1}}), c)
    assert not rules_match(rules({"attributes": {"plan": 1}}), c)
    assert not rules_match(rules({"attributes": {"missing": None}}), c)
    assert rules_match(rules({"consent_required": "whatsapp"}), c)
    assert not rules_match(rules({"consent_required": "email"}), c)


def test_consent_required_needs_an_identity_on_that_channel() -> None:
    c = _contact(identities=(Identity("email", "a@x.co"),)).with_consent(Consent("whatsapp", "granted", 1, "t"))
    assert not rules_match(segment_rules_from_input({"consent_required": "whatsapp"}), c)


def test_bad_rules_name_the_rule() -> None:
    for data, field in (
        ({"tag_all": ["x"]}, "segment.rules.tag_all"),
        ({"consent_required": "sms"}, "segment.rules.consent_required"),
        ({"tags_any": ["ok", ""]}, "segment.rules.tags_any[1]"),
        ({"attributes": {"Bad": 1}}, "segment.rules.attributes.Bad"),
    ):
        with pytest.raises(ValidationError) as info:
            segment_rules_from_input(data)
        assert info.value.field == field


def test_contact_json_round_trips_with_consent_current_and_in_history() -> None:
    """from_json(to_json()) is the same contact whether or not a current consent is the history's last."""
    granted = Consent("whatsapp", "granted", 1, "form")
    base = Contact(id="c_" + "1" * 22, identities=(Identity("whatsapp", "+573001112233"),), name="Ana")
    shared = base.with_consent(Consent("whatsapp", "denied", 0, "import")).with_consent(granted)
    apart = replace(shared, consent={"whatsapp": Consent("whatsapp", "granted", 2, "api", "typed")})
    unrecorded = replace(shared, consent_history=())
    for contact in (base, shared, apart, unrecorded):
        assert Contact.from_json(contact.to_json(), 7) == replace(contact, version=7)
    decoded = Contact.from_json(apart.to_json())
    assert decoded.consent["whatsapp"] == Consent("whatsapp", "granted", 2, "api", "typed")
    assert decoded.consent_history[-1] == granted
