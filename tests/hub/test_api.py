"""``/api/v1/tenants/{tenant}/plugins…``: what a CI pipeline or an admin's script sees."""

from __future__ import annotations

import json
from pathlib import Path

from django.test import Client

from .conftest import World

FOUR = ["messages:read", "messages:send", "contacts:read", "http:fetch"]


def _url(world: World, tail: str = "", tenant: str | None = None) -> str:
    return f"/api/v1/tenants/{tenant or world.a}/plugins{tail}"


def _install(client: Client, world: World, body: bytes, headers: dict | None = None):
    return client.post(_url(world), data=body, content_type="application/json", **(headers or world.admin))


def test_install_grant_enable_over_the_api(client: Client, world: World, order_status: bytes) -> None:
    resp = _install(client, world, order_status)
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert body["status"] == "pending-approval" and body["pending_permissions"] == FOUR
    assert body["digest"].startswith("sha256:") and body["installed_by"] == "token:ci"
    assert _install(client, world, order_status).status_code == 200, "same manifest again: no-op"

    resp = client.post(_url(world, "/acme.order-status/enable"), content_type="application/json", **world.admin)
    assert resp.status_code == 409 and resp.json()["error"] == "permissions_pending"
    assert resp.json()["pending"] == FOUR

    resp = client.post(
        _url(world, "/acme.order-status/grants"),
        {"permissions": FOUR},
        content_type="application/json",
        **world.admin,
    )
    assert resp.status_code == 200 and resp.json()["granted"] == FOUR
    revision = resp.json()["revision"]
    resp = client.post(
        _url(world, "/acme.order-status/enable"),
        {"expected_version": revision},
        content_type="application/json",
        **world.admin,
    )
    assert resp.status_code == 200 and resp.json()["status"] == "enabled"

    listing = client.get(_url(world), **world.agent).json()
    assert [(p["plugin_id"], p["status"]) for p in listing["items"]] == [("acme.order-status", "enabled")]
    audit = client.get(_url(world, "/acme.order-status/audit"), **world.agent).json()["items"]
    assert [e["action"] for e in audit] == ["enabled", "granted", "installed"]
    assert audit[0]["actor"] == "token:ci" and audit[0]["at"] > 0


def test_upgrade_shows_the_permission_diff(
    client: Client, world: World, order_status: bytes, order_status_more: bytes
) -> None:
    _install(client, world, order_status)
    client.post(
        _url(world, "/acme.order-status/grants"),
        {"permissions": FOUR},
        content_type="application/json",
        **world.admin,
    )
    client.post(_url(world, "/acme.order-status/enable"), content_type="application/json", **world.admin)
    resp = _install(client, world, order_status_more)
    assert resp.status_code == 200
    body = resp.json()
    assert body["status"] == "pending-approval" and not body["enabled"]
    assert body["previous_version"] == "1.4.0" and body["version"] == "1.5.0"
    assert body["added_permissions"] == ["contacts:write"] and body["pending_permissions"] == ["contacts:write"]


def test_every_invalid_fixture_is_422_with_the_field(client: Client, world: World, hub_fixtures: Path) -> None:
    for path in sorted((hub_fixtures / "invalid").iterdir()):
        resp = _install(client, world, path.read_bytes())
        assert resp.status_code == 422, path.name
        body = resp.json()
        assert body["error"] == "validation_error" and body["field"].startswith("manifest"), path.name
        assert body["message"].startswith(body["field"] + ": "), path.name
    assert client.get(_url(world), **world.admin).json()["items"] == [], "nothing was installed"


def test_grant_of_unknown_permission_is_422_with_the_index(client: Client, world: World, order_status: bytes) -> None:
    _install(client, world, order_status)
    resp = client.post(
        _url(world, "/acme.order-status/grants"),
        {"permissions": ["messages:read", "root:all"]},
        content_type="application/json",
        **world.admin,
    )
    assert resp.status_code == 422 and resp.json()["field"] == "permissions[1]"
    resp = client.post(
        _url(world, "/acme.order-status/grants"),
        {"permissions": "messages:read"},
        content_type="application/json",
        **world.admin,
    )
    assert resp.status_code == 422 and resp.json()["field"] == "permissions"


def test_uninstall_then_404(client: Client, world: World, hub_fixtures: Path) -> None:
    _install(client, world, (hub_fixtures / "valid" / "minimal.json").read_bytes())
    assert client.delete(_url(world, "/x.y"), **world.admin).status_code == 204
    assert client.get(_url(world, "/x.y"), **world.admin).status_code == 404
    actions = [
        e["action"] for e in client.get(f"/api/v1/tenants/{world.a}/plugin-audit", **world.admin).json()["items"]
    ]
    assert actions == ["uninstalled", "installed"]


def test_runtime_endpoint_and_pagination(client: Client, world: World, order_status: bytes) -> None:
    runtime = client.get(f"/api/v1/tenants/{world.a}/plugin-runtime", **world.agent).json()
    assert runtime["runtime_version"] == "1.6.2" and "contacts:write" in runtime["known_permissions"]
    for i in range(3):
        _install(client, world, json.dumps({**json.loads(order_status), "id": f"acme.p{i}"}).encode())
    first = client.get(_url(world) + "?limit=2", **world.agent).json()
    assert [p["plugin_id"] for p in first["items"]] == ["acme.p0", "acme.p1"] and first["next"] == "acme.p1"
    rest = client.get(_url(world) + f"?limit=2&after={first['next']}", **world.agent).json()
    assert [p["plugin_id"] for p in rest["items"]] == ["acme.p2"] and rest["next"] is None


def test_a_stale_expected_version_is_409_and_the_old_name_expected_revision_still_counts(
    client: Client, world: World, order_status: bytes
) -> None:
    """Issue 18, item 3: one wire name (``expected_version``); ``expected_revision`` is read for one release."""
    revision = _install(client, world, order_status).json()["revision"]
    for name in ("expected_version", "expected_revision"):
        stale = client.post(_url(world, "/acme.order-status/disable"), {name: revision + 5},
                            content_type="application/json", **world.admin)  # fmt: skip
        assert stale.status_code == 409, (name, stale.content)
    fresh = client.post(_url(world, "/acme.order-status/disable"), {"expected_revision": revision},
                        content_type="application/json", **world.admin)  # fmt: skip
    assert fresh.status_code == 200, fresh.content
    again = client.post(_url(world, "/acme.order-status/disable"), {"expected_version": fresh.json()["revision"]},
                        content_type="application/json", **world.admin)  # fmt: skip
    assert again.status_code == 200, again.content
    # Both names (README: the body uses expected_version): a stale expected_revision does not count.
    current = again.json()["revision"]
    both = client.post(_url(world, "/acme.order-status/disable"), {"expected_version": current,
                       "expected_revision": current + 7}, content_type="application/json", **world.admin)  # fmt: skip
    assert both.status_code == 200, both.content
    stale = client.post(_url(world, "/acme.order-status/disable"), {"expected_version": current + 5,
                        "expected_revision": current}, content_type="application/json", **world.admin)  # fmt: skip
    assert stale.status_code == 409, stale.content
