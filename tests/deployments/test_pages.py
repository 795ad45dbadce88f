"""The deployments admin pages: bots, versions timeline with gates, confirm-then-activate, audit."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.test import Client

from deployments import selectors, services

from .conftest import World, pass_gates

BOT = "tienda-bot"


def _login(client: Client, username: str) -> Client:
    client.force_login(get_user_model().objects.get(username=username))
    return client


def _seed(world: World, versions) -> None:
    for v in versions:
        services.version_publish(world.a, spec=v, actor="token:ci")
    for v in ("1.1.0", "1.2.0"):
        pass_gates(world.a, v)
    services.deployment_activate(world.a, BOT, "1.2.0", actor="user:ana")


def test_nav_links_deployments_for_admins_only(client: Client, world: World) -> None:
    assert f'href="/t/{world.a}/deployments/"' in _login(client, "ana").get(f"/t/{world.a}/").content.decode()
    assert f'href="/t/{world.a}/deployments/"' not in _login(Client(), "bo").get(f"/t/{world.a}/").content.decode()


def test_timeline_shows_gate_status_and_actions(client: Client, world: World, versions) -> None:
    _seed(world, versions)
    _login(client, "ana")
    bots = client.get(f"/t/{world.a}/deployments/").content.decode()
    assert BOT in bots and "1.2.0" in bots
    html = client.get(f"/t/{world.a}/deployments/{BOT}/").content.decode()
    assert html.index('data-version="2.0.0-rc.1"') < html.index('data-version="1.0.0"'), "newest first"
    assert html.count('data-testid="gate-status">passed<') == 2
    assert html.count('data-testid="gate-status">pending<') == 3
    assert f"/t/{world.a}/deployments/{BOT}/confirm/rollback/1.1.0" in html
    assert "confirm/activate/1.0.0" not in html, "no button for a version whose gates have not passed"
    assert "gate_run_finished" in html and "activated" in html, "recent audit is shown"


def test_rollback_needs_a_confirmation_step(client: Client, world: World, versions) -> None:
    _seed(world, versions)
    _login(client, "ana")
    url = f"/t/{world.a}/deployments/{BOT}/confirm/rollback/1.1.0"
    page = client.get(url).content.decode()
    assert "Roll back tienda-bot to 1.1.0?" in page and "Currently active: <strong>1.2.0</strong>" in page
    assert selectors.deployment_active(world.a, BOT).version == "1.2.0", "GET changes nothing"
    resp = client.post(url, {"expected_revision": 1}, follow=True)
    assert "Rolled tienda-bot back to 1.1.0." in resp.content.decode()
    active = selectors.deployment_active(world.a, BOT)
    assert (active.version, active.previous_version, active.activated_by) == (
        "1.1.0",
        "1.2.0",
        "user:ana",
    )


def test_a_stale_confirmation_is_a_conflict(client: Client, world: World, versions) -> None:
    _seed(world, versions)
    _login(client, "ana")
    resp = client.post(
        f"/t/{world.a}/deployments/{BOT}/confirm/rollback/1.1.0",
        {"expected_revision": 0},
        follow=True,
    )
    assert "changed" in resp.content.decode()
    assert selectors.deployment_active(world.a, BOT).version == "1.2.0"
    # The page's own field is expected_version now: a stale one is the question again, 409, nothing done
    # (a fresh user's report: a redirect answering 200, and expected_version ignored, 1.0.0 activated)
    url = f"/t/{world.a}/deployments/{BOT}/confirm/rollback/1.1.0"
    assert 'name="expected_version"' in client.get(url).content.decode()
    resp = client.post(url, {"expected_version": 0})
    html = resp.content.decode()
    assert resp.status_code == 409 and "Someone changed this meanwhile." in html and 'data-testid="confirm"' in html
    assert selectors.deployment_active(world.a, BOT).version == "1.2.0"
    revision = selectors.deployment_active(world.a, BOT).revision
    assert f'name="expected_version" value="{revision}"' in html  # confirming again goes ahead
    assert client.post(url, {"expected_version": revision}).status_code == 302
    assert selectors.deployment_active(world.a, BOT).version == "1.1.0"


def test_agents_see_but_cannot_switch(client: Client, world: World, versions) -> None:
    _seed(world, versions)
    _login(client, "bo")
    html = client.get(f"/t/{world.a}/deployments/{BOT}/").content.decode()
    assert "confirm/rollback" not in html
    resp = client.post(f"/t/{world.a}/deployments/{BOT}/confirm/rollback/1.1.0", {"expected_revision": 1})
    assert resp.status_code == 403


def test_audit_page_and_foreign_tenant(client: Client, world: World, versions) -> None:
    _seed(world, versions)
    _login(client, "ana")
    html = client.get(f"/t/{world.a}/deployments/{BOT}/audit").content.decode()
    assert "gate_run_finished" in html and "activated" in html
    assert client.get(f"/t/{world.b}/deployments/{BOT}/").status_code == 404
    assert client.get(f"/t/{world.a}/deployments/no-bot/").status_code == 404
