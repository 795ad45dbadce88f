"""What a person sees at a page address that names nothing, or that a GET cannot do: a page in words.

Regression tests of a fresh user's report (try5): ``/t/{t}/plugins/bogus/`` answered
422 "validation_error plugin_id: not a plugin id"; ``/t/{t}/traces/message/``
without an id 422; ``/t/{t}/crm/contacts/imports/bogus/`` Django's debug URL
page; ``/t/{t}/jobs/bogus/`` and a GET of the no-JavaScript confirmation
addresses (erase, delete, revoke) a blank 405; error pages said
"404 · not_found contact bogus not found" and "permission_denied this action
needs the admin role in tenant …".
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from botmesh_admin.tenancy import services as tenancy
from tests.backends import unique_id


def _client(tenant: str, role: str) -> Client:
    user = get_user_model().objects.create_user(unique_id(role), password="pw-user-123")
    tenancy.membership_set(tenant, username=user.username, role=role)
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def tenant(db) -> str:
    tenant = unique_id("errs")
    tenancy.tenant_create(tenant, name="Errors")
    return tenant


@pytest.fixture
def admin(tenant: str) -> Client:
    return _client(tenant, "admin")


def _page(response) -> str:  # type: ignore[no-untyped-def]
    html = response.content.decode()
    assert "<html" in html.lower(), (response.status_code, html[:300])
    assert "Page not found at" not in html, "Django's debug URL page"
    return html


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("plugins/bogus/", "This plugin does not exist."),
        ("plugins/acme.nope/", "This plugin does not exist."),
        ("crm/contacts/bogus/", "This contact does not exist."),
        ("crm/contacts/imports/bogus/", "This page does not exist."),
        ("crm/contacts/import/bogus/", "This import does not exist."),
        ("jobs/bogus/", "This job does not exist."),
        ("no-such-page/", "This page does not exist."),
        ("crm/contacts/bogus/erase", "This contact does not exist."),
        ("channels/bogus/delete", "This channel does not exist."),
        ("settings/tokens/999999/revoke", "This token does not exist."),
        ("crm/segments/bogus/delete", "This segment does not exist."),
    ],
)
def test_an_address_that_names_nothing_is_the_404_page_in_words(tenant, admin, path, words):
    response = admin.get(f"/t/{tenant}/{path}")
    html = _page(response)
    assert response.status_code == 404, (path, html[-1500:])
    assert words in html, html[-1500:]
    assert "not_found" not in html and "validation_error" not in html


def test_the_message_trace_address_without_an_id_is_a_400_page_naming_it(tenant, admin):
    response = admin.get(f"/t/{tenant}/traces/message/")
    html = _page(response)
    assert response.status_code == 400, html[-1500:]
    assert "id" in html and "validation_error" not in html


def test_a_get_of_a_confirmation_address_shows_the_confirmation_page(tenant, admin):
    from botmesh_admin.channels import services as channels
    from crm import services as crm

    contact = crm.contact_create(tenant, identities=[{"channel": "email", "address": "ana@example.com"}], name="Ana")
    segment = crm.segment_create(tenant, name="VIP", rules={})
    channels.channel_config_set(
        tenant,
        kind="telegram",
        name="help",
        bot_token="123456:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        webhook_secret="s" * 32,
    )
    token, _ = tenancy.token_create(tenant, name="ci", role="admin", created_by="test")
    for path, question in [
        (f"crm/contacts/{contact.id}/erase", "Erase the contact"),
        ("channels/help/delete", "help"),
        (f"settings/tokens/{token.pk}/revoke", "Revoke the API token"),
        (f"crm/segments/{segment.id}/delete", "Delete the segment"),
    ]:
        response = admin.get(f"/t/{tenant}/{path}")
        html = _page(response)
        assert response.status_code == 200, (path, response.status_code, html[-800:])
        assert question in html and 'name="confirm" value="yes"' in html, html[-1500:]
    # Nothing was done by the GETs.
    from crm import selectors

    assert selectors.contact_get(tenant, contact.id).id == contact.id


def test_a_get_of_a_form_only_address_is_a_page_with_words(tenant, admin):
    response = admin.get(f"/t/{tenant}/plugins/acme.nope/grant")
    html = _page(response)
    assert response.status_code in (404, 405), response.status_code
    assert "does not" in html or "form" in html


def test_an_agent_refused_an_admin_page_reads_who_may(tenant):
    agent = _client(tenant, "agent")
    response = agent.get(f"/t/{tenant}/settings/tokens/")
    html = _page(response)
    assert response.status_code == 403
    assert f"Only an admin of {tenant} can do this." in html, html[-1500:]
    assert "permission_denied" not in html


def test_an_address_without_its_final_slash_still_goes_to_the_page(tenant, admin):
    response = admin.get(f"/t/{tenant}/crm/contacts?q=ana")
    assert response.status_code == 301 and response["Location"] == f"/t/{tenant}/crm/contacts/?q=ana"
    assert admin.head(f"/t/{tenant}/crm/contacts").status_code == 301


def test_a_post_without_the_final_slash_is_a_404_naming_the_address_not_a_redirect_dropping_its_data(tenant, admin):
    """A 301 makes the browser repeat a POST as a GET without its form: the data would be lost silently."""
    response = admin.post(f"/t/{tenant}/settings/tokens", {"name": "ci"})
    assert response.status_code == 404 and "Location" not in response
    html = response.content.decode()
    assert f"send the POST to /t/{tenant}/settings/tokens/ (with the final slash)" in html
    assert admin.post(f"/t/{tenant}/no-such-page", {"x": "1"}).status_code == 404


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("traces/?kind=bogus", "kind"),
        ("journal/?state=bogus", "state"),
        ("journal/table?state=bogus", "state"),
        ("metrics/?window=99y", "window"),
        ("metrics/?bot=nobody", "bot"),
        ("crm/contacts/?prev=garbage", "prev"),
        ("crm/contacts/?after=garbage", "after"),
    ],
)
def test_a_bad_list_parameter_is_a_400_page_naming_it(tenant, admin, path, field):
    response = admin.get(f"/t/{tenant}/{path}")
    html = response.content.decode()
    assert response.status_code == 400, (path, response.status_code, html[-1500:])
    assert 'role="alert"' in html and f"{field}:" in html, html[-1500:]
    assert "validation_error" not in html


@pytest.mark.parametrize("path", ["traces/?kind=message", "journal/?state=dead", "metrics/?window=24h"])
def test_good_list_parameters_still_list(tenant, admin, path):
    assert admin.get(f"/t/{tenant}/{path}").status_code == 200, path


def test_an_unknown_address_outside_a_tenant_is_the_apps_404_page(admin):
    response = admin.get("/no-such-page/")
    html = _page(response)
    assert response.status_code == 404 and "This page does not exist." in html, html[-800:]


def test_the_time_zone_form_answers_only_a_post(tenant, admin):
    """A GET of the time-zone action is 405 (``require_POST``), not a Settings page with a 422 error."""
    response = admin.get(f"/t/{tenant}/settings/time-zone?time_zone=Europe/Madrid")
    assert response.status_code == 405 and response["Allow"] == "POST"
    from botmesh_admin.tenancy.models import Tenant

    assert Tenant.objects.get(id=tenant).time_zone == ""  # nothing set


@pytest.mark.django_db
def test_a_form_sent_without_its_csrf_token_is_the_403_page_in_words() -> None:
    """A new user posting the login form without its token saw Django's debug 403 page (``DEBUG`` runs)."""
    response = Client(enforce_csrf_checks=True).post("/login/", {"username": "a", "password": "b"})
    html = _page(response)
    assert response.status_code == 403
    assert "This form could not be checked." in html and "reload the page" in html
    assert "CSRF verification failed" not in html, "Django's own page"
