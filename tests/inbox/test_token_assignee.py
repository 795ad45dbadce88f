"""An API token never becomes a conversation's assignee (a fresh user's report: ``token-5`` was assigned)."""

from __future__ import annotations

from django.contrib.auth import get_user_model

from .test_api import api, conversation  # noqa: F401  (the fixtures)


def test_a_tokens_reply_with_assign_is_422_and_its_reply_or_handoff_assigns_nobody(api, conversation) -> None:  # noqa: F811
    cid = conversation["id"]
    assert conversation["assignee"] is None
    status, body = api.call(
        "post", f"conversations/{cid}/reply", {"text": "hola", "assign": True}, token=api.agent_token
    )
    assert (status, body["field"]) == (422, "assign")
    assert "a token is not an agent; pass agent=<member>" in body["message"]
    # A token's reply takes the chat from the bot, but leaves it unassigned.
    status, _ = api.call("post", f"conversations/{cid}/reply", {"text": "hola"}, token=api.agent_token)
    assert status == 202
    status, conv = api.call("get", f"conversations/{cid}")
    assert conv["handoff"]["active"] and conv["assignee"] is None
    api.call("post", f"conversations/{cid}/handoff", {"active": False})
    status, conv = api.call("post", f"conversations/{cid}/handoff", {"active": True})  # the admin token
    assert status == 200 and conv["handoff"]["active"] and conv["assignee"] is None
    # A human agent can still answer it: nobody holds it.
    status, conv = api.call(
        "post", f"conversations/{cid}/assign", {"agent": "ana", "expected_version": conv["version"]}
    )
    assert (status, conv["assignee"]) == (200, "ana")


def test_the_thread_names_an_api_token_as_whoami_does_not_by_its_row_id(api, conversation) -> None:  # noqa: F811
    import re

    from django.test import Client

    cid = conversation["id"]
    status, _ = api.call("post", f"conversations/{cid}/notes", {"text": "order 1042 refunded"}, token=api.agent_token)
    assert status == 201
    status, _ = api.call("post", f"conversations/{cid}/handoff", {"active": True}, token=api.agent_token)
    assert status == 200
    status, me = api.call("get", "whoami", token=api.agent_token)
    assert (status, me["actor"]) == (200, "token:bot")
    agent = Client()
    agent.force_login(get_user_model().objects.get(username="ana"))
    page = agent.get(f"/t/{api.tenant}/inbox/{cid}/").content.decode()
    assert "Private note · token:bot" in page and "taken by token:bot" in page
    assert "token:bot took the chat from the bot" in page
    assert not re.search(r"\btoken-\d+\b", page), "the id a token acts as is no name an agent knows"
