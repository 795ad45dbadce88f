"""An id in an API path that no object can have is 404 ``not_found``, like an id of none (most APIs answer so).

Regression test of a fresh user's report (try5): ``GET …/plugins/nope`` and
``GET …/conversations/xyz`` answered 422 ``validation_error``. A malformed id
in a body or query stays a 422 naming its field.
"""

from __future__ import annotations

import pytest

from tests.crm.test_api import Api, _tenant


@pytest.fixture
def api(db, tenant_id: str) -> Api:
    return _tenant(tenant_id)


@pytest.mark.parametrize("path", ["plugins/nope", "conversations/xyz", "contacts/bogus", "segments/bogus"])
def test_a_malformed_id_in_the_path_is_404_not_found(api: Api, path: str) -> None:
    r = api.get(path)
    assert r.status_code == 404, (path, r.content)
    assert r.json()["error"] == "not_found", r.content


@pytest.mark.parametrize("token_id", ["abc", "-1", "9" * 40, "999999"])
def test_revoking_a_token_id_no_token_has_is_404(api: Api, token_id: str) -> None:
    """A fresh user's report: ``DELETE …/tokens/abc`` was a 422 on ``token_id``."""
    r = api.delete(f"tokens/{token_id}")
    assert (r.status_code, r.json()["error"]) == (404, "not_found"), r.content


BAD_IDS = [pytest.param("x%00y", id="NUL"), pytest.param("a" * 5000, id="5000 characters")]


@pytest.mark.parametrize("bad", BAD_IDS)
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "contacts/{}"),
        ("patch", "contacts/{}"),
        ("delete", "contacts/{}"),
        ("post", "contacts/{}/consent"),
        ("get", "contacts/imports/{}"),
        ("get", "segments/{}"),
        ("patch", "segments/{}"),
        ("delete", "segments/{}"),
        ("get", "segments/{}/count"),
    ],
)
def test_an_id_no_crm_object_can_have_is_404_on_every_method(api: Api, method: str, path: str, bad: str) -> None:
    """Found by a new user: a NUL or a 5,000-character contact, segment or import id was a 422 naming ``key``."""
    call = getattr(api, method)
    bodies = {"patch": {"name": "x", "expected_version": 1}, "post": {"channel": "whatsapp", "status": "granted"}}
    args = (bodies[method],) if method in bodies else ()
    r = call(path.format(bad), *args)
    assert r.status_code == 404, (method, path, r.content[:300])
    body = r.json()
    assert body["error"] == "not_found" and len(body["message"]) < 120, body


def test_a_malformed_query_value_stays_422(api: Api) -> None:
    r = api.get("contacts", after="garbage")
    assert r.status_code == 422 and r.json()["field"] == "after", r.content
    assert "not a cursor of this list" in r.json()["message"], r.content  # not the shape's regular expression
