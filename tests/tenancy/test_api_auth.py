"""API tokens resolve the tenant; foreign tenants are 404; roles are enforced; one error shape."""

from __future__ import annotations

from django.test import Client

from botmesh_admin.tenancy.models import ApiToken
from botmesh_admin.tenancy.selectors import token_digest


def bearer(token: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def test_token_resolves_its_tenant(world, client: Client) -> None:
    resp = client.get("/api/v1/tenants/acme/whoami", **bearer(world.acme_token))
    assert resp.status_code == 200
    assert resp.json() == {"tenant": "acme", "role": "admin", "actor": "token:ci"}


def test_missing_or_unknown_token_is_401(world, client: Client) -> None:
    assert client.get("/api/v1/tenants/acme/whoami").status_code == 401
    resp = client.get("/api/v1/tenants/acme/whoami", **bearer("bm_nope_nope"))
    assert resp.status_code == 401
    assert resp.json() == {
        "error": "unauthenticated",
        "message": "a valid API token or session is required",
        "field": None,
    }


def test_tokens_are_stored_hashed(world) -> None:
    prefix = world.acme_token.split("_")[1]
    row = ApiToken.objects.get(prefix=prefix)
    assert row.digest == token_digest(world.acme_token)
    assert world.acme_token not in (row.digest, row.prefix, row.name)


def test_revoked_token_stops_working(world, client: Client) -> None:
    created = client.post(
        "/api/v1/tenants/acme/tokens", {"name": "temp"}, content_type="application/json", **bearer(world.acme_token)
    )
    assert created.status_code == 201
    temp = created.json()["token"]
    assert client.get("/api/v1/tenants/acme/whoami", **bearer(temp)).status_code == 200
    revoked = client.delete(f"/api/v1/tenants/acme/tokens/{created.json()['id']}", **bearer(world.acme_token))
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]
    assert client.get("/api/v1/tenants/acme/whoami", **bearer(temp)).status_code == 401


def test_revoking_a_foreign_token_is_404(world, client: Client) -> None:
    globex_id = ApiToken.objects.get(tenant_id="globex").pk
    resp = client.delete(f"/api/v1/tenants/acme/tokens/{globex_id}", **bearer(world.acme_token))
    assert resp.status_code == 404
    assert ApiToken.objects.get(pk=globex_id).revoked_at is None


def test_bad_input_is_422_naming_the_field(world, client: Client) -> None:
    resp = client.post(
        "/api/v1/tenants/acme/tokens",
        {"name": "", "role": "admin"},
        content_type="application/json",
        **bearer(world.acme_token),
    )
    assert resp.status_code == 422
    assert resp.json()["field"] == "token.name"
    resp = client.post(
        "/api/v1/tenants/acme/tokens", {"role": "admin"}, content_type="application/json", **bearer(world.acme_token)
    )
    assert resp.status_code == 422
    assert resp.json()["field"] == "name"
    # a field the body does not declare (a fresh user's report: created the token) and a number for the name
    for body, field in (({"name": "x", "role": "admin", "extra": 1}, "extra"), ({"name": 123}, "name")):
        resp = client.post("/api/v1/tenants/acme/tokens", body, content_type="application/json",
                           **bearer(world.acme_token))  # fmt: skip
        assert (resp.status_code, resp.json()["field"]) == (422, field), resp.content
    assert ApiToken.objects.filter(tenant_id="acme").count() == 2


def test_session_auth_needs_membership_and_csrf(world) -> None:
    client = Client(enforce_csrf_checks=True)
    assert client.login(username="bob", password="bob-password-1")
    assert client.get("/api/v1/tenants/acme/whoami").json()["role"] == "agent"
    assert client.get("/api/v1/tenants/globex/whoami").status_code == 404
    # an unsafe method without the CSRF token is refused
    resp = client.post("/api/v1/tenants/acme/tokens", {"name": "x"}, content_type="application/json")
    assert resp.status_code == 403 and "X-CSRFToken" in resp.json()["message"]
    assert ApiToken.objects.filter(tenant_id="acme", name="x").count() == 0


def test_a_refused_token_on_a_post_is_401_not_a_csrf_error(world, client: Client) -> None:
    """Without a session there is no CSRF to check: the caller hears that the token is not valid."""
    for headers in (bearer("bm_nope_nope"), {"HTTP_AUTHORIZATION": "Basic Ym9iOng="}, {}):
        resp = client.post("/api/v1/tenants/acme/tokens", {"name": "x"}, content_type="application/json", **headers)
        assert (resp.status_code, resp.json()["error"]) == (401, "unauthenticated"), headers
    assert ApiToken.objects.filter(tenant_id="acme", name="x").count() == 0


def test_openapi_documents_the_routes(world, client: Client) -> None:
    spec = client.get("/api/v1/openapi.json").json()
    assert "/api/v1/tenants/{tenant}/whoami" in spec["paths"]


def test_agent_token_cannot_push_a_ledger(world, client: Client) -> None:
    """Found by exploratory testing: an agent token forged an inbound customer message."""
    record = {
        "id": "m1",
        "channel": "whatsapp",
        "chatId": "whatsapp:573001112233",
        "senderId": "573001112233",
        "direction": "in",
        "type": "text",
        "body": "refund me",
        "timestamp": 1764500000000,
    }
    resp = client.post(
        "/api/v1/tenants/acme/ledger", [record], content_type="application/json", **bearer(world.acme_agent_token)
    )
    assert resp.status_code == 403
    assert client.get("/api/v1/tenants/acme/events", **bearer(world.acme_agent_token)).status_code == 403


def test_bot_token_may_push_but_not_read_conversations(world, client: Client) -> None:
    from botmesh_admin.tenancy import services

    _, bot = services.token_create("acme", name="tienda-bot", role="bot")
    assert client.get("/api/v1/tenants/acme/whoami", **bearer(bot)).json()["role"] == "bot"
    assert client.get("/api/v1/tenants/acme/handoff/whatsapp:573001112233", **bearer(bot)).status_code == 200
    resp = client.get("/api/v1/tenants/acme/conversations", **bearer(bot))
    assert resp.status_code == 403 and resp.json()["error"] == "permission_denied"
    # It says all a bot token may do (it left out the inbound feed and the replies)
    assert "inbound feed" in resp.json()["message"] and "/bots/{bot}/replies" in resp.json()["message"]
    assert client.get("/api/v1/tenants/acme/contacts", **bearer(bot)).status_code == 403
    record = {
        "id": "m1",
        "channel": "whatsapp",
        "chatId": "whatsapp:573001112233",
        "senderId": "573001112233",
        "direction": "in",
        "type": "text",
        "body": "hola",
        "timestamp": 1764500000000,
    }
    resp = client.post("/api/v1/tenants/acme/ledger", [record], content_type="application/json", **bearer(bot))
    assert resp.status_code == 202


def test_people_cannot_be_given_the_bot_role(world) -> None:
    import pytest

    from botmesh_admin.errors import ValidationError
    from botmesh_admin.tenancy import services

    with pytest.raises(ValidationError, match="membership.role"):
        services.membership_set("acme", username="bob", role="bot")


def test_api_docs_need_no_internet(client: Client) -> None:
    """Swagger UI comes from the project's static files (the machine may have no internet)."""
    html = client.get("/api/v1/docs").content.decode()
    assert "swagger-ui-bundle.js" in html and "cdn." not in html and "/static/ninja/" in html


def test_a_bot_token_acts_only_as_its_own_bot(world, client: Client) -> None:
    """Review of the bot replicas: a bot token could read the feed of, answer as and push metrics for any
    bot of its tenant. It is bound to the bot it was created for; admins keep every bot."""
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command(
        "botmesh_token", "create", "acme", "--name", "ventas bot", "--bot", "ventas-bot", "--role", "bot", stdout=out
    )
    ventas = out.getvalue().strip()
    base = "/api/v1/tenants/acme/bots"
    reply = {"conversation_id": "c_00000000000000000000aa", "in_reply_to": "m1", "text": "hola", "fence": 1}
    for path, body in (("soporte-bot/inbound?since_ms=0", None), ("soporte-bot/replies", reply)):
        if body is None:
            resp = client.get(f"{base}/{path}", **bearer(ventas))
        else:
            resp = client.post(f"{base}/{path}", body, content_type="application/json", **bearer(ventas))
        assert resp.status_code == 403, (path, resp.content)
        assert resp.json()["error"] == "permission_denied"
        assert "'soporte-bot'" in resp.json()["message"] and "'ventas-bot'" in resp.json()["message"]
    resp = client.post(
        f"{base}/soporte-bot/metrics", {"replica": "pod-a"}, content_type="application/json", **bearer(ventas)
    )
    assert (resp.status_code, resp.json()["error"]) == (403, "permission_denied")
    # Its own bot, and an admin token for any bot, pass the check (the made-up reply is then refused as such).
    assert client.get(f"{base}/ventas-bot/inbound?since_ms=0", **bearer(ventas)).status_code == 200
    resp = client.post(f"{base}/ventas-bot/replies", reply, content_type="application/json", **bearer(ventas))
    assert resp.status_code in (404, 422) and resp.json()["error"] != "permission_denied"
    assert client.get(f"{base}/soporte-bot/inbound?since_ms=0", **bearer(world.acme_token)).status_code == 200
    out = StringIO()
    call_command("botmesh_token", "list", "acme", stdout=out)
    assert "\tbot:ventas-bot\t" in out.getvalue()


def test_a_bot_token_made_over_the_api_is_bound_to_its_bot(world, client: Client) -> None:
    made = client.post(
        "/api/v1/tenants/acme/tokens",
        {"name": "ventas (pod)", "role": "bot", "bot": "ventas-bot"},
        content_type="application/json",
        **bearer(world.acme_token),
    )
    assert made.status_code == 201 and made.json()["bot"] == "ventas-bot"
    token = made.json()["token"]
    assert client.get("/api/v1/tenants/acme/bots/ventas-bot/inbound?since_ms=0", **bearer(token)).status_code == 200
    assert client.get("/api/v1/tenants/acme/bots/otro/inbound?since_ms=0", **bearer(token)).status_code == 403
    refused = client.post(
        "/api/v1/tenants/acme/tokens",
        {"name": "ops", "role": "agent", "bot": "ventas-bot"},
        content_type="application/json",
        **bearer(world.acme_token),
    )
    assert (refused.status_code, refused.json()["field"]) == (422, "token.bot")
