"""The inbox on a phone (issue 20, item 2): 390×844, no horizontal scrolling, a reply typed and sent."""

from __future__ import annotations

import pytest

from tests.conftest import login

from .test_browser import drain, shop  # noqa: F401  (the fixture: the demo shop's conversations)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1440, "height": 900}


def overflow(page) -> int:
    """Return how many CSS pixels the page is wider than the viewport (0: no horizontal scrolling)."""
    return page.evaluate("document.documentElement.scrollWidth - window.innerWidth")


def visible_in_viewport(page, selector: str) -> bool:
    """Return True if ``selector``'s box lies inside the viewport's width (and it is shown)."""
    box = page.locator(selector).first.bounding_box()
    return box is not None and box["x"] >= 0 and box["x"] + box["width"] <= page.viewport_size["width"]


def test_inbox_on_a_phone_fits_the_screen_and_a_reply_is_sent(page, shop, screenshot_dir) -> None:  # noqa: F811
    tenant, fake = shop
    page.set_viewport_size(PHONE)
    login(page, "sofia", "sofia-password-1")
    page.goto(f"/t/{tenant}/inbox/")
    # The list alone: the navigation collapsed behind a menu button, header and log-out on screen.
    assert overflow(page) <= 0
    assert page.locator(".sidenav").is_hidden()
    assert visible_in_viewport(page, "button:has-text('Log out')")
    assert page.locator(".inbox-threadpane").is_hidden()  # no empty thread pane beside the list
    page.screenshot(path=str(screenshot_dir / "inbox-phone-list.png"))
    page.locator("label.navtoggle-button").click()
    page.wait_for_selector(".sidenav a:has-text('Contacts')", state="visible")
    assert overflow(page) <= 0
    page.screenshot(path=str(screenshot_dir / "inbox-phone-menu.png"))
    page.locator("label.navtoggle-button").click()
    # The thread alone, with a way back to the list.
    page.locator(".inbox-row", has_text="Ana García").first.click()
    page.wait_for_selector(".inbox-threadhead h2:has-text('Ana García')")
    assert page.locator(".inbox-listpane").is_hidden()
    assert overflow(page) <= 0
    for selector in (".inbox-back", "button:has-text('Assign to me')", "button:has-text('Resolve')", "#reply-text"):
        assert visible_in_viewport(page, selector), selector
    page.screenshot(path=str(screenshot_dir / "inbox-phone-thread.png"))
    page.fill("#reply-text", "¡Hola Ana! Te escribo desde el teléfono")
    page.get_by_role("button", name="Send").click()
    page.wait_for_selector(".inbox-agent:has-text('desde el teléfono')")
    assert overflow(page) <= 0
    # The thread is now longer than the screen: the reply box stays on it, at the bottom.
    assert page.evaluate("document.documentElement.scrollHeight") > PHONE["height"]
    box = page.locator("#reply-text").bounding_box()
    assert box is not None and 0 <= box["y"] and box["y"] + box["height"] <= PHONE["height"]
    drain("outbox")
    assert fake.count("573001112233") == 1
    page.screenshot(path=str(screenshot_dir / "inbox-phone-replied.png"))
    page.locator(".inbox-back").click()
    page.wait_for_selector(".inbox-listpane .inbox-row")
    assert page.locator(".inbox-threadpane").is_hidden()


def test_inbox_at_desktop_size_keeps_list_and_thread_side_by_side(page, shop, screenshot_dir) -> None:  # noqa: F811
    tenant, _ = shop
    page.set_viewport_size(DESKTOP)
    login(page, "sofia", "sofia-password-1")
    page.goto(f"/t/{tenant}/inbox/")
    page.locator(".inbox-row", has_text="Ana García").first.click()
    page.wait_for_selector(".inbox-threadhead h2:has-text('Ana García')")
    assert overflow(page) <= 0
    assert page.locator(".sidenav").is_visible() and page.locator(".navtoggle-button").is_hidden()
    assert page.locator(".inbox-back").is_hidden()
    listpane, thread = page.locator(".inbox-listpane").bounding_box(), page.locator(".inbox-threadpane").bounding_box()
    assert listpane["x"] + listpane["width"] <= thread["x"] + 1  # side by side
    page.screenshot(path=str(screenshot_dir / "inbox-desktop.png"))
