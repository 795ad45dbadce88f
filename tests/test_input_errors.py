"""What a client sees when its input is refused, over the API (Django test client).

Regression tests of a new user's report: a bidi override in a contact name was
stored; a 5,000-character attribute key came back whole in ``field`` and the
message; ninja's ``loc`` said ``["body", "body", …]``; a JSON array sent for
an object body said "identities: Field required".
"""

from __future__ import annotations

import json

import pytest

from botmesh_admin.demo import fixtures_dir
from tests.crm.test_api import Api, _tenant, eager_celery  # noqa: F401  (eager_celery is a fixture)

EMAIL = [{"channel": "email", "address": "ana@example.com"}]


@pytest.fixture
def api(db, tenant_id: str, eager_celery: None) -> Api:  # noqa: F811
    return _tenant(tenant_id)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("pay\u202eknil", "U+202E RIGHT-TO-LEFT OVERRIDE"),
        ("a\u202ab", "U+202A LEFT-TO-RIGHT EMBEDDING"),
        ("a\u2066b\u2069", "U+2066 LEFT-TO-RIGHT ISOLATE"),
        ("An\u200ba", "U+200B ZERO WIDTH SPACE"),
        ("\ufeffAna", "U+FEFF ZERO WIDTH NO-BREAK SPACE"),
    ],
)
def test_a_contact_name_with_a_bidi_or_invisible_format_character_is_422_naming_it(
    api: Api, text: str, named: str
) -> None:
    r = api.post("contacts", {"name": text, "identities": EMAIL})
    assert r.status_code == 422, r.content
    body = r.json()
    assert body["field"] == "contact.name" and named in body["message"], body
    assert api.get("contacts").json()["items"] == [], "nothing written"


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("contacts", {"name": "a\ud800b", "identities": EMAIL}, "contact.name"),
        ("contacts", {"identities": EMAIL, "attributes": {"k": "v\udfff"}}, "contact.attributes.k"),
        ("segments", {"name": "seg\ud800", "rules": {}}, "segment.name"),
    ],
)
def test_a_lone_surrogate_is_422_naming_the_body_field_not_the_store_op(
    api: Api, path: str, body: dict[str, object], field: str
) -> None:
    """JSON's ``"\\ud800"`` escape decodes to a lone surrogate, which has no UTF-8 form: refused as
    the field it came in (a new user saw ``ops[0].value.name``, the Kv's own path)."""
    r = api.post(path, body)
    assert r.status_code == 422, r.content
    assert r.json()["field"] == field and "lone surrogate" in r.json()["message"], r.json()
    listed = api.get(path).json()
    assert (listed["items"] if isinstance(listed, dict) else listed) == [], "nothing written"


def test_a_segment_name_with_a_bidi_override_is_422(api: Api) -> None:
    r = api.post("segments", {"name": "vip\u202e", "rules": {}})
    assert r.status_code == 422 and "U+202E" in r.json()["message"], r.content


@pytest.mark.parametrize(
    "name",
    [
        "\U0001f469\u200d\U0001f4bb Ana",  # ZWJ emoji sequence
        "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",  # Persian with ZWNJ
        "\u0915\u094d\u200d\u0937",  # Devanagari with ZWJ
        "\u05e9\u05e8\u05d4 2\u200f",  # Hebrew with a right-to-left mark
        "\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f",  # flag tag sequence
    ],
)
def test_names_that_need_zwj_zwnj_marks_or_emoji_tags_are_kept(api: Api, name: str) -> None:
    r = api.post("contacts", {"name": name, "identities": EMAIL})
    assert r.status_code == 201, r.content
    assert r.json()["name"] == name


def test_a_long_attribute_key_is_echoed_cut_to_200_characters(api: Api) -> None:
    r = api.post("contacts", {"identities": EMAIL, "attributes": {"K" * 5000: 1}})
    assert r.status_code == 422, r.content
    body = r.json()
    assert len(body["field"]) == 200 and body["field"].endswith("…")
    assert body["field"].startswith("contact.attributes.KKK")
    assert body["message"].startswith(body["field"] + ": attribute names match")
    assert len(r.content) < 1000, len(r.content)


def test_a_long_key_in_a_schema_error_is_echoed_cut(api: Api) -> None:
    """ninja's own errors: a key the schema knows nothing of, inside a list it checks."""
    r = api.post("contacts", {"identities": [{"channel": "email", "address": 5, "x" * 5000: 1}]})
    assert r.status_code == 422, r.content
    assert len(r.content) < 1000, len(r.content)
    huge = {"K" * 5000: {"identities": 3}}
    r = api.post("segments", {"name": "x", "rules": huge})
    assert r.status_code == 422 and len(r.content) < 1500, r.content[:300]
    body = r.json()
    assert len(body["field"] or "") <= 200
    assert all(len(part) <= 200 for e in body.get("errors", []) for part in e["loc"])


def test_schema_errors_name_the_body_fields_without_a_body_prefix(api: Api) -> None:
    r = api.post("contacts", {"name": 5, "identities": "x"})
    assert r.status_code == 422, r.content
    body = r.json()
    assert body["field"] == ".".join(body["errors"][0]["loc"])
    assert body["message"].startswith(body["field"] + ": ")
    assert sorted(e["loc"] for e in body["errors"]) == [["identities"], ["name"]]


def test_query_errors_name_the_parameter(api: Api) -> None:
    r = api.get("contacts", limit=0)
    assert r.status_code == 422 and r.json()["field"] == "limit"
    assert r.json()["errors"][0]["loc"] == ["limit"]


@pytest.mark.parametrize(("raw", "kind"), [(b"[1,2]", "array"), (b'"x"', "string"), (b"3", "number"),
                                           (b"null", "null"), (b"true", "boolean")])  # fmt: skip
def test_a_body_that_is_not_a_json_object_is_422_naming_body(api: Api, raw: bytes, kind: str) -> None:
    r = api.post("contacts", raw)
    assert r.status_code == 422, r.content
    body = r.json()
    assert body["field"] == "body" and body["error"] == "validation_error"
    assert body["message"] == f"body: must be a JSON object, not {kind}"
    assert api.get("contacts").json()["items"] == []


def test_an_optional_object_body_still_refuses_an_array(api: Api) -> None:
    """``body: PluginRevisionIn | None = None``: no body is fine, an array is not."""
    r = api.post("plugins/acme.nope/enable", b"[1]")
    assert r.status_code == 422 and r.json()["field"] == "body", r.content
    assert api.post("plugins/acme.nope/enable").status_code == 404


def test_a_plugin_manifest_name_with_a_bidi_override_is_422_naming_it(api: Api) -> None:
    """The JSON-typed family (``json_string``: hub manifests, deployment specs) refuses it too."""
    manifest = json.loads((fixtures_dir() / "hub" / "valid" / "order-status.json").read_text())
    manifest["name"] = "Order \u202estatus"
    r = api.post("plugins", json.dumps(manifest), content_type="application/json")
    assert r.status_code == 422, r.content
    assert r.json()["field"] == "manifest.name" and "U+202E RIGHT-TO-LEFT OVERRIDE" in r.json()["message"]


@pytest.mark.parametrize("given", [True, "1", 1.0])
def test_a_number_field_takes_a_json_integer_only_not_a_boolean_or_a_string(api: Api, given: object) -> None:
    """A fresh user's report: ``"fence": true`` and ``"snoozed_until_ms": true`` were read as 1 (pydantic's lax
    mode); request bodies are strict, so the 422 names the field and nothing changes."""
    cid = api.post("contacts", {"name": "Ana", "identities": EMAIL}).json()["id"]
    r = api.patch(f"contacts/{cid}", {"expected_version": given, "name": "Ann"})
    assert r.status_code == 422 and r.json()["field"] == "expected_version", r.content
    assert api.get(f"contacts/{cid}").json()["name"] == "Ana"
