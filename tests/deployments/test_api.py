"""``/api/v1/tenants/{tenant}/bots/{bot}/versions…``: what a CI pipeline and an admin see."""

from __future__ import annotations

from django.test import Client

from .conftest import GATES, World

BOT = "tienda-bot"


def _bot(world: World, tail: str = "", tenant: str | None = None) -> str:
    return f"/api/v1/tenants/{tenant or world.a}/bots/{BOT}{tail}"


def _post(client: Client, url: str, body: object | None, headers: dict[str, str]):
    return (
        client.post(url, body, content_type="application/json", **headers)
        if body is not None
        else client.post(url, content_type="application/json", **headers)
    )


def _pass_gates(client: Client, world: World, version: str, result: str = "succeeded") -> None:
    for gate in GATES:
        run = _post(
            client,
            _bot(world, f"/versions/{version}/gates/{gate}/runs"),
            {"lease_ms": 60000},
            world.admin,
        )
        assert run.status_code == 201, run.content
        done = _post(
            client,
            _bot(world, f"/versions/{version}/gates/{gate}/runs/{run.json()['run_id']}"),
            {"result": result, "details": "ok"},
            world.admin,
        )
        assert done.status_code == 200, done.content


def test_ci_publishes_runs_gates_and_activates(client: Client, world: World, versions) -> None:
    for v in versions:
        resp = _post(client, _bot(world, "/versions"), v, world.admin)
        assert resp.status_code == 201, resp.content
    assert _post(client, _bot(world, "/versions"), versions[0], world.admin).status_code == 200
    conflict = _post(client, _bot(world, "/versions"), {**versions[0], "notes": "changed"}, world.admin)
    assert conflict.status_code == 409 and conflict.json()["error"] == "version_exists"

    listing = client.get(_bot(world, "/versions?limit=2"), **world.agent).json()
    assert [v["version"] for v in listing["items"]] == ["2.0.0-rc.1", "1.2.0"] and listing["next"] == "4"
    rest = client.get(_bot(world, f"/versions?limit=10&after={listing['next']}"), **world.agent).json()
    assert [v["version"] for v in rest["items"]] == ["1.1.1", "1.1.0", "1.0.0"] and rest["next"] is None

    blocked = _post(client, _bot(world, "/versions/1.2.0/activate"), None, world.admin)
    assert blocked.status_code == 409 and blocked.json()["error"] == "gates_not_passed"
    _pass_gates(client, world, "1.2.0")
    version = client.get(_bot(world, "/versions/1.2.0"), **world.agent).json()
    assert version["gate_status"] == "passed" and [g["status"] for g in version["gates"]] == ["succeeded"] * 3

    active = _post(client, _bot(world, "/versions/1.2.0/activate"), {"expected_revision": 0}, world.admin)
    assert active.status_code == 200 and active.json()["version"] == "1.2.0" and active.json()["revision"] == 1
    stale = _post(client, _bot(world, "/versions/1.2.0/activate"), {"expected_revision": 0}, world.admin)
    assert stale.status_code == 409 and stale.json()["current_version"] == 1
    assert client.get(_bot(world, "/active"), **world.agent).json()["version"] == "1.2.0"
    assert client.get(_bot(world, "/versions/1.2.0"), **world.agent).json()["active"] is True

    bots = client.get(f"/api/v1/tenants/{world.a}/bots", **world.agent).json()["items"]
    assert bots == [{"bot": BOT, "active": active.json()}]


def test_rollback_prune_and_audit(client: Client, world: World, versions) -> None:
    for v in versions[:3]:
        _post(client, _bot(world, "/versions"), v, world.admin)
    for v in ("1.0.0", "1.1.1"):
        _pass_gates(client, world, v)
    _post(client, _bot(world, "/versions/1.0.0/activate"), None, world.admin)
    _post(client, _bot(world, "/versions/1.1.1/activate"), None, world.admin)
    back = _post(client, _bot(world, "/rollback"), {"to": "1.0.0"}, world.admin)
    assert back.status_code == 200
    assert (back.json()["kind"], back.json()["previous_version"]) == ("rollback", "1.1.1")
    pruned = _post(client, _bot(world, "/prune"), {"keep": 1}, world.admin)
    assert pruned.json() == {"pruned": ["1.1.0"]}, "never the active 1.0.0"
    gone = _post(client, _bot(world, "/rollback"), {"to": "1.1.0"}, world.admin)
    assert gone.status_code == 404
    audit = client.get(_bot(world, "/audit?limit=3"), **world.agent).json()
    assert [e["action"] for e in audit["items"]] == ["pruned", "rolled_back", "activated"]
    assert audit["items"][0]["actor"] == "token:ci" and audit["next"]


def test_gate_reservation_conflicts_over_the_api(client: Client, world: World, versions) -> None:
    _post(client, _bot(world, "/versions"), versions[0], world.admin)
    first = _post(client, _bot(world, "/versions/1.0.0/gates/unit-tests/runs"), None, world.admin)
    assert first.status_code == 201
    second = _post(client, _bot(world, "/versions/1.0.0/gates/unit-tests/runs"), None, world.admin)
    assert second.status_code == 409 and second.json()["error"] == "gate_running"
    stale = _post(
        client,
        _bot(world, "/versions/1.0.0/gates/unit-tests/runs/run_nope"),
        {"result": "succeeded"},
        world.admin,
    )
    assert stale.status_code == 409 and stale.json()["error"] == "stale_gate_run"
    bad = _post(
        client,
        _bot(world, f"/versions/1.0.0/gates/unit-tests/runs/{first.json()['run_id']}"),
        {"result": "maybe"},
        world.admin,
    )
    assert bad.status_code == 422 and bad.json()["field"] == "result"


def test_bad_input_is_422_with_the_field_path(client: Client, world: World, versions) -> None:
    bad_digest = {**versions[0], "artifact": {"digest": "md5:1", "url": "oci://r.example.com/x:1"}}
    resp = _post(client, _bot(world, "/versions"), bad_digest, world.admin)
    assert resp.status_code == 422 and resp.json()["field"] == "version.artifact.digest"
    resp = _post(client, _bot(world, "/versions"), {**versions[0], "bot": "other-bot"}, world.admin)
    assert resp.status_code == 422 and resp.json()["field"] == "version.bot"
    resp = client.post(_bot(world, "/versions"), b"{not json", content_type="application/json", **world.admin)
    assert resp.status_code == 422 and resp.json()["field"] == "version"
    resp = _post(client, _bot(world, "/prune"), {"keep": 0}, world.admin)
    assert resp.status_code == 422 and resp.json()["field"] == "keep"
    resp = client.get(_bot(world, "/versions?after=zzz"), **world.admin)
    assert resp.status_code == 422 and resp.json()["field"] == "after"
    resp = client.get(f"/api/v1/tenants/{world.a}/bots/Bad%20Bot/versions", **world.admin)
    assert resp.status_code == 422 and resp.json()["field"] == "bot"


def test_an_admin_decides_a_manual_gate_with_a_reason_and_only_such_a_gate(
    client: Client, world: World, versions
) -> None:
    """Issue 20 item 4: a person approves or rejects a gate that waits for one (manual…, or an inconclusive run)."""
    rc = versions[-1]
    assert _post(client, _bot(world, "/versions"), rc, world.admin).status_code == 201
    url = _bot(world, f"/versions/{rc['version']}/gates/manual-approval/decision")
    assert _post(client, url, {"decision": "approve", "reason": "ok"}, world.agent).status_code == 403
    empty = _post(client, url, {"decision": "approve", "reason": "  "}, world.admin)
    assert empty.status_code == 422 and empty.json()["field"] == "reason"
    bad = _post(client, url, {"decision": "maybe", "reason": "x"}, world.admin)
    assert bad.status_code == 422 and bad.json()["field"] == "decision"
    # audit text (a fresh user's report: a bell, a zero-width space and a bidi override were stored)
    for disguised in ("no\u0007bell", "zero\u200bwidth", "flip \u202e rlo"):
        spoofed = _post(client, url, {"decision": "reject", "reason": disguised}, world.admin)
        assert spoofed.status_code == 422 and spoofed.json()["field"] == "reason", disguised
    runner_gate = _bot(world, f"/versions/{rc['version']}/gates/unit-tests/decision")
    refused = _post(client, runner_gate, {"decision": "approve", "reason": "trust me"}, world.admin)
    assert refused.status_code == 409 and refused.json()["error"] == "gate_not_decidable"

    done = _post(client, url, {"decision": "approve", "reason": "QA signed off"}, world.admin)
    assert done.status_code == 200, done.content
    gate = next(g for g in done.json()["gates"] if g["name"] == "manual-approval")
    assert gate["status"] == "succeeded" and gate["details"] == "approved by token:ci: QA signed off"
    again = _post(client, url, {"decision": "reject", "reason": "changed my mind"}, world.admin)
    assert again.status_code == 409 and again.json()["error"] == "gate_not_decidable"
    audit = client.get(_bot(world, "/audit"), **world.agent).json()["items"]
    assert audit[0]["action"] == "gate_run_finished" and audit[0]["actor"] == "token:ci"
