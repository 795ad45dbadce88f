"""The inbox search as an agent uses it: message hits say which channel each came through (one contact
on two numbers has two rows of the same text and time), and the box searches as she types (htmx, after a
pause) while Enter and pages without JavaScript keep working."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model

from tests.conftest import login

from .test_channel_identity import ANA, drain, post_whatsapp, two_number_body, two_of_each  # noqa: F401


def seeded(t):
    assert post_whatsapp(t, two_number_body()) == 200  # "Hola, ¿tienen envíos a Medellín?" on main and sales
    drain()
    return t.conversations()


def hits(html: str) -> list[str]:
    """The "In messages" rows' text, tags stripped."""
    part = html.split("In messages", 1)[1]
    rows = re.findall(r'<li class="inbox-row inbox-hit">(.*?)</li>', part, re.S)
    return [" ".join(re.sub(r"<[^>]+>", " ", r).split()) for r in rows]


@pytest.mark.django_db
def test_message_hits_name_the_channel_of_each_row(two_of_each):  # noqa: F811
    t = two_of_each
    seeded(t)
    t.client.force_login(get_user_model().objects.get(username="ana"))
    found = hits(t.client.get(f"/t/{t.id}/inbox/?q=medellin").content.decode())
    assert len(found) == 2 and all("Medellín" in h for h in found)
    assert sorted("whatsapp · main" in h for h in found) == [False, True]
    assert sorted("whatsapp · sales" in h for h in found) == [False, True]


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_search_box_searches_as_she_types_and_enter_still_works(page, two_of_each, screenshot_dir):  # noqa: F811
    t = two_of_each
    conversations = seeded(t)
    user = get_user_model().objects.get(username="ana")
    user.set_password("ana-password-1")
    user.save()
    login(page, "ana", "ana-password-1")
    page.goto(f"/t/{t.id}/inbox/")
    assert page.locator(".inbox-row").count() == 2 and page.locator(".inbox-searchhead").count() == 0
    page.locator("#f-q").press_sequentially("medell", delay=30)  # no Enter
    page.wait_for_selector(".inbox-searchhead:has-text('In messages')")
    assert page.locator(".inbox-hit").count() == 2
    assert page.locator(".inbox-hit .pill", has_text="sales").count() == 1
    assert "q=medell" in page.url  # the address is the search's: reload and back work
    page.screenshot(path=str(screenshot_dir / "inbox-search-as-you-type.png"))
    page.locator("#f-q").fill("ana")
    page.locator("#f-q").press("Enter")  # the form's own submit, as without JavaScript
    page.wait_for_url(re.compile(r"q=ana"))
    page.wait_for_selector(".inbox-searchhead:has-text('Names and phones matching “ana”')")
    assert page.locator(".inbox-row:not(.inbox-hit)").count() == len(conversations)


@pytest.mark.django_db
@pytest.mark.parametrize("q", ["a" * 240, "ana\x00"], ids=["240 characters", "NUL"])
def test_a_search_the_api_refuses_is_a_400_page_naming_q(two_of_each, q):  # noqa: F811
    """Found by a new user: a 240-character search answered 200 (cut to 200 without a word); the API says 422."""
    t = two_of_each
    t.client.force_login(get_user_model().objects.get(username="ana"))
    r = t.client.get(f"/t/{t.id}/inbox/", {"q": q})
    assert r.status_code == 400 and b"change the search, or clear it" in r.content
