"""Login with a failed-attempt limit; tenant pages only for members; no asset from a CDN."""

from __future__ import annotations

import re

from django.test import Client

from botmesh_admin.tenancy.models import ApiToken


def test_anonymous_is_sent_to_login(world, client: Client) -> None:
    resp = client.get("/t/acme/")
    assert resp.status_code == 302 and resp["Location"].startswith("/login/")


def test_member_sees_tenant_and_switcher(world, client: Client) -> None:
    client.login(username="alice", password="alice-password-1")
    resp = client.get("/t/acme/")
    assert resp.status_code == 200
    html = resp.content.decode()
    assert '<option value="acme" selected>' in html
    assert 'value="globex"' not in html  # alice is not a member of globex


def test_non_member_gets_404(world, client: Client) -> None:
    client.login(username="alice", password="alice-password-1")
    assert client.get("/t/globex/").status_code == 404
    assert client.get("/t/globex/settings/tokens/").status_code == 404


def test_agent_cannot_open_token_page(world, client: Client) -> None:
    client.login(username="bob", password="bob-password-1")
    assert client.get("/t/acme/settings/tokens/").status_code == 403


def test_admin_creates_and_revokes_token_in_ui(world, client: Client) -> None:
    client.login(username="alice", password="alice-password-1")
    resp = client.post("/t/acme/settings/tokens/", {"name": "deploy", "role": "admin"}, follow=True)
    token = re.search(r'data-testid="new-token">([^<]+)<', resp.content.decode()).group(1)
    api = Client()  # no session: the token alone
    assert api.get("/api/v1/tenants/acme/whoami", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 200
    row = ApiToken.objects.get(tenant_id="acme", name="deploy")
    asked = client.post(f"/t/acme/settings/tokens/{row.pk}/revoke")  # no confirm=yes: the page asks first
    assert asked.status_code == 200 and "Revoke the API token" in asked.content.decode()
    assert api.get("/api/v1/tenants/acme/whoami", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 200
    client.post(f"/t/acme/settings/tokens/{row.pk}/revoke", {"confirm": "yes"})
    assert api.get("/api/v1/tenants/acme/whoami", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 401
    assert "revoked" in client.get("/t/acme/settings/tokens/").content.decode()


def test_login_is_locked_after_five_failures(world) -> None:
    client = Client()
    for _ in range(5):
        resp = client.post("/login/", {"username": "alice", "password": "wrong"})
        assert resp.status_code == 200
    resp = client.post("/login/", {"username": "alice", "password": "alice-password-1"})
    assert resp.status_code == 429
    assert "Too many failed attempts" in resp.content.decode()
    assert "_auth_user_id" not in client.session


def test_login_form_has_csrf(world) -> None:
    client = Client(enforce_csrf_checks=True)
    html = client.get("/login/").content.decode()
    assert 'name="csrfmiddlewaretoken"' in html
    assert client.post("/login/", {"username": "alice", "password": "alice-password-1"}).status_code == 403


def test_pages_load_no_asset_from_another_host(world, client: Client) -> None:
    client.login(username="alice", password="alice-password-1")
    for url in ("/login/", "/t/acme/", "/t/acme/settings/tokens/"):
        html = client.get(url).content.decode()
        for ref in re.findall(r'(?:src|href)="([^"]+)"', html):
            assert not re.match(r"^(https?:)?//", ref), f"{url} loads {ref} from another host"


def test_reloading_the_token_page_creates_no_second_token(world, client: Client) -> None:
    """Found by exploratory testing: the token was shown in the POST answer, so a reload re-posted."""
    client.login(username="alice", password="alice-password-1")
    resp = client.post("/t/acme/settings/tokens/", {"name": "once", "role": "admin"})
    assert resp.status_code == 302
    first = client.get("/t/acme/settings/tokens/").content.decode()
    assert 'data-testid="new-token"' in first
    again = client.get("/t/acme/settings/tokens/").content.decode()
    assert 'data-testid="new-token"' not in again  # shown once
    assert ApiToken.objects.filter(tenant_id="acme", name="once").count() == 1


def test_switch_without_a_tenant_goes_home(world, client: Client) -> None:
    """Found by exploratory testing: /switch without ?tenant= was a 500."""
    client.login(username="alice", password="alice-password-1")
    assert client.get("/switch").status_code == 302
    assert client.get("/switch?tenant=").url == "/"
    assert client.get("/switch?tenant=../x").url == "/"


def test_login_lands_on_the_last_tenant_used(world, client: Client) -> None:
    from botmesh_admin.tenancy import services

    services.membership_set("globex", username="alice", role="agent")
    client.login(username="alice", password="alice-password-1")
    client.get("/t/globex/")
    assert client.get("/").url == "/t/globex/"


def test_the_demo_admin_lands_on_tienda_after_login_the_tenant_joined_first(db) -> None:
    """Found by a new user: after login the demo admin landed on /t/soporte/ (first by id), the README says tienda."""
    from botmesh_admin import demo

    demo.ensure_accounts()
    for username, password in ((demo.ADMIN_USER, demo.ADMIN_PASSWORD), (demo.AGENT_USER, demo.AGENT_PASSWORD)):
        client = Client()
        resp = client.post("/login/", {"username": username, "password": password}, follow=True)
        assert [url for url, _ in resp.redirect_chain] == ["/", f"/t/{demo.DEMO_TENANT}/"], username
        assert resp.status_code == 200 and '<option value="tienda" selected>' in resp.content.decode()


def test_a_user_lands_on_the_tenant_they_joined_first_not_the_first_by_id(world) -> None:
    from botmesh_admin.tenancy import services

    services.tenant_create("aaa", name="AAA")
    services.membership_set("globex", username="bob", role="agent")  # bob: acme first, then globex, then aaa
    services.membership_set("aaa", username="bob", role="agent")
    client = Client()
    resp = client.post("/login/", {"username": "bob", "password": "bob-password-1"}, follow=True)
    assert resp.redirect_chain[-1][0] == "/t/acme/"


def test_every_page_names_an_icon_that_is_served_and_favicon_ico_is_found(world, client: Client) -> None:
    """Found by a new user: /favicon.ico was a 404 on every page."""
    for path in ("/login/", "/t/acme/"):
        if path != "/login/":
            client.login(username="alice", password="alice-password-1")
        html = client.get(path).content.decode()
        [href] = re.findall(r'<link rel="icon" href="([^"]+)"', html)
        icon = client.get(href)
        assert icon.status_code == 200, path
        assert icon["Content-Type"] in ("image/x-icon", "image/vnd.microsoft.icon")
        assert b"".join(icon.streaming_content if icon.streaming else [icon.content])[:4] == b"\0\0\1\0"  # ICO
    bare = Client().get("/favicon.ico", follow=True)
    assert bare.status_code == 200 and bare.redirect_chain == [(href, 301)]


def test_a_refused_token_keeps_the_name_with_the_error_under_it(world, client: Client) -> None:
    """Issue 20 item 6: the form again (422) with what was typed, the error under the field in plain words."""
    client.login(username="alice", password="alice-password-1")
    resp = client.post("/t/acme/settings/tokens/", {"name": " " * 3, "role": "admin"})
    html = resp.content.decode()
    assert resp.status_code == 422 and "token.name" not in html
    assert 'name="name" required maxlength="100" value="   " aria-invalid="true"' in html
    assert 'id="token-name-error" role="alert" data-testid="field-error">Must be 1-100 characters.<' in html
    assert not ApiToken.objects.filter(tenant_id="acme", name="").exists()


def test_a_token_name_with_a_bidi_override_is_refused_on_the_page_and_the_api(world, client: Client) -> None:
    """A name that displays differently from what it holds (U+202E) is refused like a contact's, naming the field."""
    from botmesh_admin.tenancy import services

    client.login(username="alice", password="alice-password-1")
    resp = client.post("/t/acme/settings/tokens/", {"name": "tok\u202eevil", "role": "admin"})
    html = resp.content.decode()
    assert resp.status_code == 422 and "Token created" not in html and "token.name" not in html
    assert (
        'id="token-name-error" role="alert" data-testid="field-error">Contains U+202E RIGHT-TO-LEFT OVERRIDE,' in html
    )
    _, plaintext = services.token_create("acme", name="api-admin", role="admin")
    api = client.post(
        "/api/v1/tenants/acme/tokens",
        {"name": "api\u202eevil", "role": "admin"},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {plaintext}",
    )
    assert api.status_code == 422, api.content
    assert api.json()["field"] == "token.name" and "U+202E RIGHT-TO-LEFT OVERRIDE" in api.json()["message"]
    bell = client.post("/t/acme/settings/tokens/", {"name": "a\x07b", "role": "admin"})
    assert bell.status_code == 422 and "Contains a control character." in bell.content.decode()
    assert not ApiToken.objects.filter(tenant_id="acme", name__contains="evil").exists()
