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


def test_a_malformed_query_value_stays_422(api: Api) -> None:
    r = api.get("contacts", after="garbage")
    assert r.status_code == 422 and r.json()["field"] == "after", r.content
