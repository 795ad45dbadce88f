"""Text search over conversations (issue 20, item 8): by contact name and phone through the ``conv_text``
index on every store (O(page)), by message text through a bounded scan that says what it searched."""

from __future__ import annotations

import pytest

from botmesh_admin.errors import ValidationError
from inbox import selectors
from inbox.services import message_project

from .test_services import record

pytestmark = pytest.mark.django_db

PEOPLE = [
    ("whatsapp:573001112233", "Ana García", "¿tienen envíos a Medellín?"),
    ("whatsapp:573009998877", "Andrés Pérez", "quiero cambiar la talla"),
    ("telegram:700000123", "Ana Sofía Ruiz", "hola"),
    ("whatsapp:5491122334455", None, "precio del envío"),
]


def seed(inbox, tenant: str) -> dict[str, str]:
    ids = {}
    for i, (chat, name, text) in enumerate(PEOPLE):
        extra = {"senderName": name} if name else {}
        result = message_project(tenant, record(f"s{i}", 1000 * i, chat=chat, body=text, **extra))
        ids[chat] = result.conversation_id
    return ids


def names(rows) -> list[str]:
    return sorted(r.conversation.display_name or r.conversation.chat_key for r in rows)


def test_search_by_name_words_accents_and_prefixes(inbox, tenant_id):
    seed(inbox, tenant_id)
    search = lambda q, **kw: selectors.conversation_search(tenant_id, q, agent="ana", store=inbox, **kw)  # noqa: E731
    assert names(search("ana")[0]) == ["Ana García", "Ana Sofía Ruiz"]
    assert names(search("GARCIA")[0]) == ["Ana García"]
    assert names(search("an")[0]) == ["Ana García", "Ana Sofía Ruiz", "Andrés Pérez"]
    assert names(search("ana ruiz")[0]) == ["Ana Sofía Ruiz"]  # every term must match
    assert search("zoe")[0] == [] and search("  ")[0] == []


def test_search_by_phone_in_international_or_national_form_and_telegram_id(inbox, tenant_id):
    seed(inbox, tenant_id)
    search = lambda q: names(selectors.conversation_search(tenant_id, q, agent="ana", store=inbox)[0])  # noqa: E731
    assert search("+57 300 111") == ["Ana García"]
    assert search("3009998877") == ["Andrés Pérez"]
    assert search("5491122") == ["whatsapp:5491122334455"]
    assert search("700000123") == ["Ana Sofía Ruiz"]


def test_search_pages_with_a_cursor_and_applies_the_list_filters(inbox, tenant_id):
    ids = seed(inbox, tenant_id)
    first, cursor = selectors.conversation_search(tenant_id, "an", agent="ana", limit=2, store=inbox)
    assert len(first) == 2 and cursor is not None
    rest, end = selectors.conversation_search(tenant_id, "an", agent="ana", limit=2, after=cursor, store=inbox)
    assert end is None and len(rest) == 1
    assert {r.conversation.id for r in first + rest} == {ids[c] for c, n, _ in PEOPLE if n}
    assert names(selectors.conversation_search(tenant_id, "ana", agent="ana", channel="telegram", store=inbox)[0]) == [
        "Ana Sofía Ruiz"
    ]
    with pytest.raises(ValidationError, match="after"):
        selectors.conversation_search(tenant_id, "zz", agent="ana", after=cursor, store=inbox)


def test_a_renamed_conversation_is_found_by_its_new_name_only(inbox, tenant_id):
    """The index entries move in the conversation's own commit (no stale hit)."""
    from dataclasses import replace

    from inbox.stores.base import Change

    ids = seed(inbox, tenant_id)
    conv = inbox.conversation_get(tenant_id, ids["whatsapp:573001112233"])
    inbox.write(tenant_id, Change(conversation=replace(conv, display_name="Anita Gómez"), previous=conv))
    search = lambda q: names(selectors.conversation_search(tenant_id, q, agent="ana", store=inbox)[0])  # noqa: E731
    assert search("garcia") == [] and search("gomez") == ["Anita Gómez"]


def test_message_text_search_is_a_bounded_scan_of_recent_conversations(inbox, tenant_id):
    seed(inbox, tenant_id)
    hits, scanned = selectors.message_search(tenant_id, "ENVIO", agent="ana", store=inbox)
    assert sorted(m.text for _, m in hits) == ["precio del envío", "¿tienen envíos a Medellín?"]
    assert scanned == len(PEOPLE) <= selectors.TEXT_SCAN_CONVERSATIONS
    assert selectors.message_search(tenant_id, "", agent="ana", store=inbox) == ([], 0)


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_agent_searches_the_inbox_by_name_phone_and_message_text(page, screenshot_dir) -> None:
    from django.contrib.auth import get_user_model

    from botmesh_admin.tenancy import services as tenancy
    from inbox.stores import default_store
    from tests.backends import unique_id
    from tests.conftest import login

    tenant = unique_id("busca")
    tenancy.tenant_create(tenant, name="Busca")
    get_user_model().objects.create_user("sofia", password="sofia-password-1")
    tenancy.membership_set(tenant, username="sofia", role="agent")
    seed(default_store(), tenant)
    login(page, "sofia", "sofia-password-1")
    page.goto(f"/t/{tenant}/inbox/")
    page.fill("#f-q", "garcia")
    page.press("#f-q", "Enter")
    page.wait_for_selector(".inbox-searchhead:has-text('matching “garcia”')")
    assert [t.strip() for t in page.locator(".inbox-row:not(.inbox-hit) .inbox-name").all_inner_texts()] == [
        "Ana García"
    ]
    assert page.input_value("#f-q") == "garcia"  # the box keeps what was typed
    page.fill("#f-q", "envio")
    page.press("#f-q", "Enter")
    page.wait_for_selector(".inbox-searchhead:has-text('In messages')")
    assert page.locator(".inbox-none", has_text="No contact name or phone matches.").count() == 1
    hits = page.locator(".inbox-hit .inbox-preview").all_inner_texts()
    assert sorted(h.strip() for h in hits) == ["precio del envío", "¿tienen envíos a Medellín?"]
    assert "most recently active conversations" in page.inner_text(".inbox-searchhead >> nth=1")  # says it is bounded
    page.screenshot(path=str(screenshot_dir / "inbox-search.png"))
    page.fill("#f-q", "+57 300 999")
    page.press("#f-q", "Enter")
    page.wait_for_selector(".inbox-searchhead:has-text('matching “+57 300 999”')")
    page.locator(".inbox-row:not(.inbox-hit)", has_text="Andrés Pérez").click()
    page.wait_for_selector(".inbox-threadhead h2:has-text('Andrés Pérez')")
    assert page.input_value("#f-q") == "+57 300 999"  # the search stays beside the open thread
