"""The one text validator family: ``validate_text`` (both wordings), ``validate_name``, ``validate_identifier``."""

from __future__ import annotations

import pytest

from botmesh_admin.errors import BadType, ValidationError
from botmesh_admin.validation import json_string, validate_identifier, validate_name, validate_text


def _refusal(check, *args, **kwargs) -> tuple[str | None, str]:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError) as caught:
        check(*args, **kwargs)
    return caught.value.field, caught.value.problem


def test_validate_text_refuses_blank_by_default_and_allows_it_when_asked() -> None:
    assert validate_text("hi", "c.name", max_len=5) == "hi"
    assert _refusal(validate_text, "  ", "c.name", max_len=5) == ("c.name", "must not be empty")
    assert validate_text("  ", "c.name", max_len=5, blank=True) == "  "
    assert _refusal(validate_text, "toolong", "c.name", max_len=5) == ("c.name", "longer than 5 characters")


def test_validate_text_refuses_controls_and_spoofing_characters() -> None:
    assert validate_text("a\tb", "f", max_len=9) == "a\tb"
    assert _refusal(validate_text, "a\nb", "f", max_len=9) == ("f", "contains a control character")
    assert validate_text("a\nb", "f", max_len=9, allowed_controls="\t\n") == "a\nb"
    assert _refusal(validate_text, "a\tb", "f", max_len=9, allowed_controls="") == ("f", "contains a control character")
    field, message = _refusal(validate_text, "pay\u202eknil", "f", max_len=20)
    assert field == "f" and message.startswith("contains U+202E RIGHT-TO-LEFT OVERRIDE")
    with pytest.raises(BadType, match="must be a string, not int"):
        validate_text(3, "f", max_len=9)


def test_the_json_wording_names_json_types() -> None:
    with pytest.raises(BadType, match="must be a string, not number"):
        validate_text(3, "spec.id", max_len=9, json=True)
    assert _refusal(validate_text, " ", "spec.id", max_len=9, json=True) == ("spec.id", "must not be blank")
    assert _refusal(validate_text, "\x01", "spec.id", max_len=9, json=True, blank=True) == (
        "spec.id",
        "contains control characters",
    )
    assert validate_text("a\nb", "spec.id", max_len=9, json=True) == "a\nb"
    # json_string is the same check under its older name (blank allowed by default there)
    assert json_string(" ", "spec.id", max_len=9) == " "
    assert _refusal(json_string, " ", "spec.id", max_len=9, blank=False) == ("spec.id", "must not be blank")


def test_validate_name_strips_and_refuses_blank() -> None:
    assert validate_name("  Ana  ") == "Ana"
    assert _refusal(validate_name, "   ") == ("name", "must not be empty")
    assert _refusal(validate_name, "x" * 201, "contact.name") == ("contact.name", "longer than 200 characters")


def test_validate_identifier_names_the_character() -> None:
    assert validate_identifier("crm:contacts", "table") == "crm:contacts"
    assert _refusal(validate_identifier, "", "key") == ("key", "must not be empty")
    assert _refusal(validate_identifier, "a\tb", "key") == ("key", "contains control character U+0009")
    assert _refusal(validate_identifier, "a\ud800", "key") == ("key", "contains a lone surrogate (not valid UTF-8)")
    assert _refusal(validate_identifier, "a{b}", "table", forbid="{}") == ("table", "must not contain '{'")
    assert _refusal(validate_identifier, "é" * 257, "key") == ("key", "longer than 512 bytes")
    with pytest.raises(BadType, match="must be a string, not int"):
        validate_identifier(1, "key")
