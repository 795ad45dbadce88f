"""The inbox lists one contact's conversations (the CRM contact page's link, ``?contact=``), and refuses
filter values it cannot read instead of ignoring them. Driven through signed webhooks, the API and the
pages; before the fix ``?contact=`` showed every conversation and ``?unread=maybe`` was ignored."""

from __future__ import annotations

import re

from django.contrib.auth import get_user_model

from .test_channel_identity import ANA, drain, post_telegram, post_whatsapp, two_number_body, two_of_each  # noqa: F401


def seeded(t):
    assert post_whatsapp(t, two_number_body()) == 200  # Ana on the numbers main and sales: one contact
    assert post_telegram(t, "shop", "02_text.json") == 200  # someone else
    drain()
    conversations = t.conversations()
    assert len(conversations) == 3
    t.client.force_login(get_user_model().objects.get(username="ana"))
    return conversations


def row_ids(html: str) -> set[str]:
    return set(re.findall(r'/inbox/(cv_[a-z0-9]+)/[?"]', html))


def test_contact_link_lists_that_contacts_conversations_on_the_page_and_in_the_api(two_of_each):  # noqa: F811
    t = two_of_each
    conversations = seeded(t)
    ana = {conversations[("main", ANA)]["id"], conversations[("sales", ANA)]["id"]}
    contact = conversations[("main", ANA)]["contact_id"]
    other = next(c["id"] for k, c in conversations.items() if k[1] != ANA)
    # The contact page's link, followed as a person would.
    contact_page = t.client.get(f"/t/{t.id}/crm/contacts/{contact}/").content.decode()
    link = re.search(r'href="([^"]+)" data-testid="conversations-link"', contact_page).group(1)
    html = t.client.get(link).content.decode()
    assert ana <= row_ids(html) and other not in html
    assert 'data-testid="contact-filter"' in html and f'name="contact" value="{contact}"' in html
    # The API's conversations_url is the page; the API filters the same way.
    status, page = t.api("get", f"conversations?contact={contact}")
    assert status == 200 and {c["id"] for c in page["items"]} == ana
    status, page = t.api("get", f"conversations?contact={contact}&channel_name=sales&limit=1")
    assert status == 200 and [c["id"] for c in page["items"]] == [conversations[("sales", ANA)]["id"]]
    # An unknown contact: no rows, not every conversation.
    assert t.api("get", "conversations?contact=c-nobody")[1]["items"] == []
    html = t.client.get(f"/t/{t.id}/inbox/?contact=c-nobody").content.decode()
    assert "No conversations here." in html and not (ana | {other}) & row_ids(html)


def test_bad_filter_values_answer_400_naming_the_parameter(two_of_each):  # noqa: F811
    t = two_of_each
    conversations = seeded(t)
    for query, field in (("unread=maybe", "unread"), ("contact=Not%20an%20id", "contact")):
        response = t.client.get(f"/t/{t.id}/inbox/?{query}")
        assert response.status_code == 400 and field in response.content.decode(), query
    status, body = t.api("get", "conversations?unread=maybe")
    assert status == 422 and "unread" in str(body)
    # An unknown channel name answers an empty list, as ?channel=whatsapp/nope does.
    for query in ("channel_name=nope", "channel=whatsapp/nope"):
        response = t.client.get(f"/t/{t.id}/inbox/?{query}")
        assert response.status_code == 200 and "No conversations here." in response.content.decode(), query
        assert not row_ids(response.content.decode()) & {c["id"] for c in conversations.values()}
    assert t.api("get", "conversations?channel_name=nope")[1]["items"] == []
    html = t.client.get(f"/t/{t.id}/inbox/?channel_name=sales").content.decode()
    assert row_ids(html) & {c["id"] for c in conversations.values()} == {conversations[("sales", ANA)]["id"]}
