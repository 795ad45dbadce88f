"""The hub's admin pages: catalogue, plugin page with permission diff, grant and enable buttons."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.test import Client

from hub import selectors, services

from .conftest import World

FOUR = ["messages:read", "messages:send", "contacts:read", "http:fetch"]


def _login(client: Client, username: str) -> Client:
    client.force_login(get_user_model().objects.get(username=username))
    return client


def test_nav_links_plugins_for_admins_only(client: Client, world: World) -> None:
    page = _login(client, "ana").get(f"/t/{world.a}/")
    assert f'href="/t/{world.a}/plugins/"' in page.content.decode()
    other = Client()
    page = _login(other, "bo").get(f"/t/{world.a}/")
    assert f'href="/t/{world.a}/plugins/"' not in page.content.decode()


def test_install_grant_enable_through_the_pages(
    client: Client, world: World, order_status: bytes, order_status_more: bytes
) -> None:
    _login(client, "ana")
    base = f"/t/{world.a}/plugins/"
    resp = client.post(base + "install", {"manifest": order_status.decode()}, follow=True)
    html = resp.content.decode()
    assert resp.status_code == 200 and "Installed acme.order-status 1.4.0." in html
    assert "pending-approval" in html and "not granted" in html
    plugin = selectors.plugin_get(world.a, "acme.order-status")

    resp = client.post(base + "acme.order-status/enable", {"expected_revision": plugin.revision}, follow=True)
    assert "asks for permissions not granted" in resp.content.decode()

    resp = client.post(
        base + "acme.order-status/grant",
        {"permission": FOUR, "expected_revision": plugin.revision},
        follow=True,
    )
    assert "Permissions granted." in resp.content.decode()
    plugin = selectors.plugin_get(world.a, "acme.order-status")
    resp = client.post(base + "acme.order-status/enable", {"expected_revision": plugin.revision}, follow=True)
    html = resp.content.decode()
    assert "acme.order-status enabled." in html and 'data-testid="status">enabled<' in html

    services.plugin_install(world.a, manifest=order_status_more, actor="token:ci")
    html = client.get(base + "acme.order-status/").content.decode()
    assert 'data-testid="permission-diff"' in html
    assert "+ contacts:write" in html and "Changed from 1.4.0 to 1.5.0" in html
    assert "pending-approval" in html
    catalogue = client.get(base).content.decode()
    assert "awaiting: contacts:write" in catalogue


def test_a_stale_page_cannot_approve_a_changed_manifest(
    client: Client, world: World, order_status: bytes, order_status_more: bytes
) -> None:
    _login(client, "ana")
    seen, _ = services.plugin_install(world.a, manifest=order_status, actor="user:ana")
    services.plugin_install(world.a, manifest=order_status_more, actor="token:ci")
    resp = client.post(
        f"/t/{world.a}/plugins/acme.order-status/grant",
        {"permission": FOUR + ["contacts:write"], "expected_revision": seen.revision},
        follow=True,
    )
    assert "changed since revision" in resp.content.decode()
    assert selectors.plugin_get(world.a, "acme.order-status").granted == ()


def test_bad_manifest_shows_the_field(client: Client, world: World) -> None:
    _login(client, "ana")
    resp = client.post(
        f"/t/{world.a}/plugins/install",
        {"manifest": '{"id": 1, "name": "Y", "version": "0.1.0", "runtime": "^1.0.0", "permissions": []}'},
    )
    html = resp.content.decode()
    assert resp.status_code == 422 and "manifest.id" not in html  # plain words, not the domain path
    # the pasted manifest is still in the box, the problem under it, naming the key inside the manifest
    assert "{&quot;id&quot;: 1, &quot;name&quot;: &quot;Y&quot;" in html
    error = 'id="install-manifest-error" role="alert" data-testid="field-error">id: must be a string, not number.<'
    assert error in html


def test_agents_read_pages_but_cannot_write(client: Client, world: World, order_status: bytes) -> None:
    services.plugin_install(world.a, manifest=order_status, actor="user:ana")
    _login(client, "bo")
    assert client.get(f"/t/{world.a}/plugins/").status_code == 200
    page = client.get(f"/t/{world.a}/plugins/acme.order-status/")
    assert page.status_code == 200 and 'data-testid="enable"' not in page.content.decode()
    assert client.post(f"/t/{world.a}/plugins/acme.order-status/enable").status_code == 403
    assert client.post(f"/t/{world.a}/plugins/install", {"manifest": order_status.decode()}).status_code == 403


def test_foreign_tenant_pages_are_404(client: Client, world: World, order_status: bytes) -> None:
    services.plugin_install(world.a, manifest=order_status, actor="user:ana")
    _login(client, "ana")
    assert client.get(f"/t/{world.b}/plugins/").status_code == 404
    assert client.get(f"/t/{world.a}/plugins/acme.missing/").status_code == 404


def test_uninstall_asks_first_then_uninstalls(client: Client, world: World, order_status: bytes) -> None:
    """Issue 20 item 5: the Uninstall button asked only through an onsubmit script (none without JavaScript)."""
    services.plugin_install(world.a, manifest=order_status, actor="user:ana")
    _login(client, "ana")
    url = f"/t/{world.a}/plugins/acme.order-status/uninstall"
    asked = client.post(url)
    assert asked.status_code == 200 and "Uninstall acme.order-status?" in asked.content.decode()
    assert selectors.plugin_get(world.a, "acme.order-status") is not None
    done = client.post(url, {"confirm": "yes"}, follow=True)
    assert "acme.order-status uninstalled." in done.content.decode()
    htmx = client.post(url, {"confirm": "yes"}, HTTP_HX_REQUEST="true")  # gone now: the error page, not a crash
    assert htmx.status_code == 404


def test_enable_with_a_stale_revision_is_409_on_the_plugin_page_as_it_is_now(
    client: Client, world: World, order_status: bytes
) -> None:
    """A fresh user's report: a refused Enable redirected (200) with a message."""
    _login(client, "ana")
    seen, _ = services.plugin_install(world.a, manifest=order_status, actor="user:ana")
    services.plugin_grant(world.a, "acme.order-status", permissions=FOUR, actor="user:ana")
    resp = client.post(f"/t/{world.a}/plugins/acme.order-status/enable", {"expected_revision": seen.revision})
    assert resp.status_code == 409
    html = resp.content.decode()
    assert 'data-testid="form-error"' in html and "Someone changed this plugin meanwhile" in html
    assert f"revision {seen.revision + 1}" in html  # the page as it is now
    assert "expected_revision" not in html.split('data-testid="form-error"')[1].split("</div>")[0]
    assert selectors.plugin_get(world.a, "acme.order-status").enabled is False
