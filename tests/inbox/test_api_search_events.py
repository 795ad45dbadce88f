"""The inbox API's text search (``GET …/conversations?q=``) and conversation events
(``GET …/conversations/{id}/events``), issue 20 item 8."""

from __future__ import annotations

from inbox.stores import default_store

from .test_api import api  # noqa: F401  (the fixture)
from .test_search import PEOPLE, seed


def test_conversations_q_searches_names_and_phones_and_pages(api) -> None:  # noqa: F811
    seed(default_store(), api.tenant)
    status, body = api.call("get", "conversations?q=ana")
    assert status == 200 and sorted(c["display_name"] for c in body["items"]) == ["Ana García", "Ana Sofía Ruiz"]
    status, body = api.call("get", "conversations?q=%2B57%20300%20999")
    assert [c["display_name"] for c in body["items"]] == ["Andrés Pérez"]
    status, first = api.call("get", "conversations?q=an&limit=2")
    status, rest = api.call("get", f"conversations?q=an&limit=2&after={first['next']}")
    names = [c["display_name"] for c in first["items"] + rest["items"]]
    assert sorted(names) == sorted(n for _, n, _ in PEOPLE if n) and rest["next"] is None
    status, body = api.call("get", "conversations?q=ana&unread=true")
    assert status == 422 and body["field"] == "unread"
    status, body = api.call("get", "conversations?q=ana", token=api.other_token, tenant=api.other_tenant)
    assert status == 200 and body["items"] == []  # another tenant finds nothing of this one


def test_a_search_with_a_nul_or_over_200_characters_is_refused_as_the_contacts_search_is(api) -> None:  # noqa: F811
    """Found by a new user: ``q=%00`` answered 200 with no rows and ``q=ana%00`` found Ana (contacts: 422)."""
    seed(default_store(), api.tenant)
    for q, says in (("%00", "control character"), ("ana%00", "control character"), ("a" * 201, "200")):
        status, body = api.call("get", f"conversations?q={q}")
        assert (status, body["field"]) == (422, "q") and says in body["message"], body
        status, body = api.call("get", f"contacts?q={q}")
        assert (status, body["field"]) == (422, "q"), body


def test_events_list_who_changed_the_conversation(api) -> None:  # noqa: F811
    ids = seed(default_store(), api.tenant)
    cid = ids["whatsapp:573001112233"]
    status, conv = api.call("get", f"conversations/{cid}")
    assert (
        api.call("post", f"conversations/{cid}/assign", {"agent": "ana", "expected_version": conv["version"]})[0] == 200
    )
    assert api.call("post", f"conversations/{cid}/status", {"status": "resolved"})[0] == 200
    status, body = api.call("get", f"conversations/{cid}/events")
    assert status == 200
    assert [(e["kind"], e["value"]) for e in body["items"]] == [("assigned", "ana"), ("status", "resolved")]
    assert all(e["actor"].startswith("token-") for e in body["items"])  # the API token that acted
    assert api.call("get", f"conversations/{cid}/events", token=api.other_token, tenant=api.other_tenant)[0] == 404
    assert api.call("get", f"conversations/{cid}/events?since_ms=-1")[0] == 422
