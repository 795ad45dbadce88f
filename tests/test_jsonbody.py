"""Untrusted JSON: every body the API parses answers 400/422 with a clear message, never 500."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from botmesh_admin.errors import ValidationError
from botmesh_admin.jsonbody import MAX_DEPTH, json_load, json_load_object
from botmesh_admin.tenancy import services as tenancy
from tests.backends import unique_id


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 900, 3000, 100_000])
def test_json_nested_too_deeply_is_a_validation_error_never_a_recursion_error(depth: int) -> None:
    """Found by exploratory testing: ``json.loads`` raises RecursionError (no ValueError) at 3000 levels."""
    with pytest.raises(ValidationError) as info:
        json_load(nested(depth), field="records")
    assert info.value.field == "records" and "nested more than 64 levels" in info.value.problem


def test_json_nested_up_to_the_limit_is_read() -> None:
    """Found by exploratory testing (the cap must not refuse ordinary documents)."""
    assert json_load(nested(MAX_DEPTH), field="body") == json.loads(nested(MAX_DEPTH))
    assert json_load('{"a": [1, {"b": null}]}', field="body") == {"a": [1, {"b": None}]}


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b'{"a": NaN}', "NaN is not JSON"),
        (b"[Infinity]", "Infinity is not JSON"),
        (b"\xff\xfe", "not UTF-8"),
        (b"{nope", "invalid JSON"),
        ("\ud800", "not UTF-8"),
        (b'{"n": 1' + b"0" * 5000 + b"}", "more than 4300 digits"),
    ],
)
def test_what_is_not_json_is_a_validation_error_naming_the_field(raw: bytes | str, problem: str) -> None:
    """Found by exploratory testing: every malformed body must be a 4xx, whatever is wrong with it."""
    with pytest.raises(ValidationError) as info:
        json_load(raw, field="body")
    assert info.value.field == "body" and problem in info.value.problem


def test_object_loader_refuses_other_types_duplicate_keys_and_large_bodies() -> None:
    """Found by exploratory testing (the hub manifest rules, now shared)."""
    with pytest.raises(ValidationError, match="not a JSON object \\(got array\\)"):
        json_load_object(b"[]", field="manifest")
    with pytest.raises(ValidationError) as info:
        json_load_object(b'{"id": 1, "id": 2}', field="manifest", reject_duplicate_keys=True)
    assert info.value.field == "manifest.id"
    with pytest.raises(ValidationError, match="larger than 4 bytes"):
        json_load_object(b'{"a": 1}', field="manifest", max_bytes=4)


DEEP_ARRAY = nested(3000)
DEEP_OBJECT = b'{"a":' * 3000 + b"1" + b"}" * 3000

# (method, path relative to the tenant, token role): every endpoint that reads a JSON body.
BODY_ENDPOINTS = [
    ("post", "ledger", "bot"),
    ("post", "bots/tienda-bot/metrics", "bot"),
    ("post", "contacts", "admin"),
    ("patch", "contacts/c_00000000000000000000aa", "admin"),
    ("post", "segments", "admin"),
    ("post", "segments/preview", "admin"),
    ("post", "campaigns", "admin"),
    ("post", "campaigns/plan", "admin"),
    ("post", "plugins", "admin"),
    ("post", "bots/tienda-bot/versions", "admin"),
    ("put", "channels/main", "admin"),
    ("post", "conversations/cv_00000000000000000000/notes", "admin"),
    ("post", "conversations/cv_00000000000000000000/reply", "admin"),
    ("post", "tokens", "admin"),
]


@pytest.fixture
def tokens(db) -> tuple[str, dict[str, str]]:
    tenant = unique_id("json")
    tenancy.tenant_create(tenant, name="Json")
    names = {"admin": "admin", "bot": "tienda-bot"}  # a bot token acts as its own bot: the one in the paths
    return tenant, {role: tenancy.token_create(tenant, name=names[role], role=role)[1] for role in ("admin", "bot")}


@pytest.mark.parametrize(("method", "path", "role"), BODY_ENDPOINTS)
@pytest.mark.parametrize("body", [DEEP_ARRAY, DEEP_OBJECT], ids=["array", "object"])
def test_every_json_body_nested_3000_deep_is_4xx_with_a_clear_message(tokens, method, path, role, body) -> None:
    """Found by exploratory testing: ``[[[…`` 3000 levels deep answered 500 with a traceback."""
    tenant, by_role = tokens
    client = Client(raise_request_exception=False)
    response = getattr(client, method)(
        f"/api/v1/tenants/{tenant}/{path}",
        body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {by_role[role]}",
    )
    assert response.status_code in (400, 422), response.content[:300]
    answer = response.json()
    assert answer["error"] == "validation_error" and "nested more than 64 levels" in answer["message"]
