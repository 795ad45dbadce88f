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


def test_the_api_names_a_token_author_as_the_pages_do_next_to_the_agent_id(api, conversation) -> None:  # noqa: F811
    """``author`` / ``taken_by`` / ``actor`` stay the agent id (``token-<id>``); ``*_name`` says ``token:<name>``."""
    cid = conversation["id"]
    status, note = api.call("post", f"conversations/{cid}/notes", {"text": "refund sent"}, token=api.agent_token)
    assert status == 201 and note["author"].startswith("token-") and note["author_name"] == "token:bot"
    status, conv = api.call("post", f"conversations/{cid}/handoff", {"active": True}, token=api.agent_token)
    assert status == 200 and conv["handoff"]["taken_by_name"] == "token:bot"
    status, state = api.call("get", f"handoff/{conversation['chat_key']}")  # what a bot asks
    assert (status, state["handed_off"], state["taken_by_name"]) == (200, True, "token:bot")
    assert conv["handoff"]["released_by_name"] is None and conv["assignee_name"] is None
    status, conv = api.call("post", f"conversations/{cid}/handoff", {"active": False})  # the admin token
    status, notes = api.call("get", f"conversations/{cid}/notes")
    assert [n["author_name"] for n in notes["items"]] == ["token:bot"]
    status, events = api.call("get", f"conversations/{cid}/events")
    names = [(e["kind"], e["actor_name"]) for e in events["items"] if e["kind"].startswith("handoff")]
    assert names[0] == ("handoff_taken", "token:bot") and names[-1][0] == "handoff_released"
    assert names[-1][1].startswith("token:") and names[-1][1] != "token:bot"
    status, _ = api.call("post", f"conversations/{cid}/reply", {"text": "hola"}, token=api.agent_token)
    assert status == 202
    status, page = api.call("get", f"conversations/{cid}/messages")
    replies = [m["reply"] for m in page["items"] if m["reply"]]
    assert replies and replies[-1]["author_name"] == "token:bot"
    # A member is named by their username, in both fields.
    status, conv = api.call("get", f"conversations/{cid}")
    status, conv = api.call(
        "post", f"conversations/{cid}/assign", {"agent": "ana", "expected_version": conv["version"]}
    )
    assert (status, conv["assignee"], conv["assignee_name"]) == (200, "ana", "ana")
