"""CRM pages as a signed-in member sees them (no JavaScript needed to read them)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from botmesh_admin.celery import app as celery_app
from botmesh_admin.demo import fixtures_dir
from botmesh_admin.tenancy import services as tenancy
from crm import selectors, services

FIXTURE = fixtures_dir() / "crm" / "contacts.csv"


def _member(tenant: str, username: str, role: str) -> Client:
    get_user_model().objects.create_user(username=username, password="x-very-long-password")
    tenancy.membership_set(tenant, username=username, role=role)
    client = Client()
    client.force_login(get_user_model().objects.get(username=username))
    return client


@pytest.fixture
def tenant(db, tenant_id: str) -> str:
    tenancy.tenant_create(tenant_id, name="Shop")
    return tenant_id


@pytest.fixture
def admin(tenant: str) -> Client:
    return _member(tenant, f"admin-{tenant}", "admin")


@pytest.fixture
def agent(tenant: str) -> Client:
    return _member(tenant, f"agent-{tenant}", "agent")


@pytest.fixture
def eager_celery(transactional_db):  # no test transaction: the journal drain queued after commit runs at once
    previous = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = previous


def test_import_page_runs_the_import_and_shows_the_report(admin: Client, tenant: str, eager_celery) -> None:
    r = admin.post(
        f"/t/{tenant}/crm/contacts/import/", {"file": SimpleUploadedFile("contacts.csv", FIXTURE.read_bytes())}
    )
    assert r.status_code == 302
    page = admin.get(r["Location"])
    html = page.content.decode()
    assert 'data-status="done"' in html and "hx-trigger" not in html, "a finished import stops polling"
    assert "201 created · 1 merged into existing contacts · 1 bad row" in html
    assert "<td>204</td><td><code>phone</code></td>" in html
    assert "<td>204</td><td><code>marketing_consent</code></td>" in html
    fragment = admin.get(r["Location"], HTTP_HX_REQUEST="true").content.decode()
    assert fragment.lstrip().startswith('<div id="import-progress"')


def test_running_import_polls_for_progress(admin: Client, tenant: str) -> None:
    job = services.contact_import_start(tenant, filename="a.csv", data=b"name,phone\nA,3001112233\n")
    html = admin.get(f"/t/{tenant}/crm/contacts/import/{job.id}/").content.decode()
    assert 'hx-trigger="every 1s"' in html and "0 of 1 rows" in html


def test_contact_list_search_and_tag_filter(agent: Client, tenant: str) -> None:
    services.contact_create(
        tenant, name="Ana García", tags=["vip"], identities=[{"channel": "whatsapp", "address": "3001112233"}]
    )
    services.contact_create(tenant, name="Luis", identities=[{"channel": "email", "address": "l@x.co"}])
    html = agent.get(f"/t/{tenant}/crm/contacts/").content.decode()
    assert "Ana García" in html and "Luis" in html and "+573001112233" in html
    assert f'href="/t/{tenant}/crm/contacts/"' in html, "nav shows Contacts"
    html = agent.get(f"/t/{tenant}/crm/contacts/", {"q": "garcia"}).content.decode()
    assert "Ana García" in html and "Luis" not in html
    html = agent.get(f"/t/{tenant}/crm/contacts/", {"tag": "vip"}, HTTP_HX_REQUEST="true").content.decode()
    assert "Ana García" in html and "Luis" not in html and "<h1>" not in html
    assert "Import CSV" not in agent.get(f"/t/{tenant}/crm/contacts/").content.decode(), "agents see no import link"


@pytest.mark.parametrize(("q", "says"), [("x" * 5000, "longer than 200 characters"), ("\x00", "control character")])
def test_a_search_the_api_refuses_is_refused_by_the_page_too(agent: Client, tenant: str, q: str, says: str) -> None:
    """A new user's 5,000-character search was "No contacts match" on the page and a 422 from the API:
    one rule (``crm.selectors.contact_list``), and the search box echoes no NUL nor 5,000 characters."""
    services.contact_create(tenant, name="Ana", identities=[{"channel": "email", "address": "a@x.co"}])
    response = agent.get(f"/t/{tenant}/crm/contacts/", {"q": q})
    html = response.content.decode()
    assert response.status_code == 400 and says in html, html[-2000:]
    assert "\x00" not in html and "x" * 201 not in html


def test_contact_detail_shows_consent_history_and_conversations_link(agent: Client, tenant: str) -> None:
    c = services.contact_create(
        tenant,
        name="Ana",
        identities=[{"channel": "telegram", "address": "700001004"}],
        attributes={"score": 1, "code": "1"},
    )
    services.consent_set(
        tenant, c.id, channel="telegram", status="denied", source="telegram", evidence="telegram: user blocked the bot"
    )
    html = agent.get(f"/t/{tenant}/crm/contacts/{c.id}/").content.decode()
    assert f'href="/t/{tenant}/inbox/?contact={c.id}"' in html
    assert "telegram: user blocked the bot" in html
    assert "<code>1</code>" in html and "<code>&quot;1&quot;</code>" in html, "number and text look different"
    r = agent.post(
        f"/t/{tenant}/crm/contacts/{c.id}/consent",
        {"channel": "telegram", "status": "granted", "evidence": "user sent /start"},
    )
    assert r.status_code == 302
    assert selectors.contact_get(tenant, c.id).consent["telegram"].source == f"user:agent-{tenant}"
    agent.post(f"/t/{tenant}/crm/contacts/{c.id}/tags", {"tag": "Nuevo"})
    assert selectors.contact_get(tenant, c.id).tags == ("nuevo",)
    assert agent.post(f"/t/{tenant}/crm/contacts/{c.id}/erase").status_code == 403
    assert agent.get(f"/t/{tenant}/crm/contacts/c_missing/").status_code == 404


def test_admin_erases_from_the_detail_page(admin: Client, tenant: str) -> None:
    c = services.contact_create(tenant, name="Ana", identities=[{"channel": "telegram", "address": "7"}])
    asked = admin.post(f"/t/{tenant}/crm/contacts/{c.id}/erase")  # no confirm=yes: asked, nothing erased
    assert asked.status_code == 200 and "for good?" in asked.content.decode()
    assert selectors.contact_get(tenant, c.id).name == "Ana"
    r = admin.post(f"/t/{tenant}/crm/contacts/{c.id}/erase", {"confirm": "yes"}, follow=True)
    assert "erased: 1 identities" in r.content.decode()
    assert selectors.contact_list(tenant).items == []


def test_segments_page_saves_rules_and_shows_live_counts(admin: Client, tenant: str) -> None:
    for i, plan in enumerate([1, "1", True]):
        services.contact_create(
            tenant,
            name=f"P{i}",
            tags=["vip"],
            attributes={"plan": plan},
            identities=[{"channel": "telegram", "address": str(10 + i)}],
        )
    r = admin.post(f"/t/{tenant}/crm/segments/", {"name": "Plan one", "tags_all": "vip", "attributes": "plan = 1"})
    assert r.status_code == 302
    html = admin.get(f"/t/{tenant}/crm/segments/").content.decode()
    assert "Plan one" in html and '<span class="badge" data-testid="segment-count">1</span>' in html
    preview = admin.post(f"/t/{tenant}/crm/segments/preview", {"attributes": 'plan = "1"'}).content.decode()
    assert 'data-testid="preview-count">1<' in preview and "P1" in preview
    bad = admin.post(f"/t/{tenant}/crm/segments/preview", {"attributes": "Plan = 1"}).content.decode()
    assert "Attributes: Plan: attribute names match" in bad  # the input and the key as typed, no domain path
    sid = selectors.segment_list(tenant)[0].id
    assert "P0" in admin.get(f"/t/{tenant}/crm/segments/{sid}/").content.decode()


def test_pages_of_another_tenant_are_404(agent: Client, tenant: str) -> None:
    tenancy.tenant_create(tenant + "-b", name="Other")
    assert agent.get(f"/t/{tenant}-b/crm/contacts/").status_code == 404


def test_segment_form_reads_a_deeply_nested_attribute_value_as_text() -> None:
    """Found by exploratory testing: ``plan = [[[…`` 3000 levels deep raised RecursionError (500)."""
    from crm.views import rules_from_form

    deep = "[" * 3000 + "]" * 3000
    rules = rules_from_form({"attributes": f"plan = {deep}\nscore = 3"})
    assert rules["attributes"] == {"plan": deep, "score": 3}


def test_a_refused_tag_or_consent_keeps_what_was_typed_under_its_field(agent: Client, tenant: str) -> None:
    """Issue 20 item 6: the contact page again (422), the typed text in its box, the problem under it."""
    c = services.contact_create(tenant, name="Ana", identities=[{"channel": "telegram", "address": "700001005"}])
    r = agent.post(f"/t/{tenant}/crm/contacts/{c.id}/tags", {"tag": "¡vip!"})
    html = r.content.decode()
    assert r.status_code == 422 and "tags[0]" not in html and "validation_error" not in html
    assert 'name="tag" required maxlength="64" value="¡vip!" aria-invalid="true"' in html
    assert 'id="tag-tag-error" role="alert" data-testid="field-error">Must be 1-64 letters' in html
    r = agent.post(
        f"/t/{tenant}/crm/contacts/{c.id}/consent",
        {"channel": "telegram", "status": "granted", "evidence": "pidió\u202eno"},
    )
    html = r.content.decode()
    assert r.status_code == 422 and 'value="pidió\u202eno" aria-invalid="true"' in html
    assert 'id="consent-evidence-error"' in html and "consent.evidence" not in html
    assert (
        selectors.contact_get(tenant, c.id).tags == () and "telegram" not in selectors.contact_get(tenant, c.id).consent
    )


def test_a_tag_action_other_than_add_or_remove_is_refused_and_changes_nothing(agent: Client, tenant: str) -> None:
    """A fresh user's report: ``action=explode`` added the tag."""
    c = services.contact_create(tenant, name="Ana", identities=[{"channel": "telegram", "address": "700001005"}])
    r = agent.post(f"/t/{tenant}/crm/contacts/{c.id}/tags", {"tag": "x", "action": "explode"})
    assert r.status_code == 422 and 'id="tag-tag-error" role="alert"' in r.content.decode()
    assert "Unknown action: the tag buttons add or remove" in r.content.decode()
    assert selectors.contact_get(tenant, c.id).tags == ()
    assert agent.post(f"/t/{tenant}/crm/contacts/{c.id}/tags", {"tag": "x"}).status_code == 302  # the add form's
    assert selectors.contact_get(tenant, c.id).tags == ("x",)


def test_a_contact_edit_with_numbers_of_4400_digits_is_refused_under_its_fields(agent: Client, tenant: str) -> None:
    """Found by a new user: a version or a Telegram id of 4,400 digits was a 500 (Python reads no such integer)."""
    c = services.contact_create(tenant, name="Ana", identities=[{"channel": "telegram", "address": "700001005"}])
    url = f"/t/{tenant}/crm/contacts/{c.id}/edit"
    r = agent.post(url, {"version": str(c.version), "name": "Ana", "identities": "telegram " + "9" * 4400})
    assert r.status_code == 422
    assert 'field-error">Line 1, address: not a Telegram user id (a positive integer)' in r.content.decode()
    for bad in ("9" * 4400, "abc", "", "-1"):
        r = agent.post(url, {"version": bad, "name": "Ann", "identities": "telegram 700001005"})
        assert r.status_code == 422  # the form shows the contact as it is now, its version in the hidden field
        # and says why (a fresh user's report: a 422 with no error anywhere on the page)
        assert 'id="edit-version-error" role="alert" data-testid="field-error">Reload the page' in r.content.decode()
    stored = selectors.contact_get(tenant, c.id)
    assert (stored.version, stored.name) == (c.version, "Ana")


def test_the_contact_edit_shows_every_bad_field_and_line_at_once_and_writes_nothing(agent: Client, tenant: str) -> None:
    """A name with U+202E, two bad identity lines and a line that is no ``name = value``: each under its field."""
    c = services.contact_create(tenant, name="Ana", identities=[{"channel": "telegram", "address": "700001005"}])
    typed = {
        "version": str(c.version),
        "name": "Ana\u202eevil",
        "identities": "whatsapp notaphone\nfax 123",
        "attributes": 'plan = "gold"\nthis is not a line',
    }
    r = agent.post(f"/t/{tenant}/crm/contacts/{c.id}/edit", typed)
    html = r.content.decode()
    assert r.status_code == 422
    assert 'id="edit-name-error" role="alert" data-testid="field-error">Contains U+202E RIGHT-TO-LEFT OVERRIDE' in html
    identities = html.split('id="edit-identities-error" role="alert" data-testid="field-error">')[1].split("</p>")[0]
    assert identities.startswith("Line 1, address: ") and "Line 2, channel: must be one of" in identities, identities
    assert (
        'id="edit-attributes-error" role="alert" data-testid="field-error">Line 2: write the name, '
        "&#x27;=&#x27;, then the value" in html
    )
    assert "Item " not in html and "contact." not in html and 'data-testid="form-error"' not in html
    assert "Ana\u202eevil" in html and "whatsapp notaphone\nfax 123</textarea>" in html  # what was typed is kept
    stored = selectors.contact_get(tenant, c.id)
    assert (stored.version, stored.name, stored.attributes) == (c.version, "Ana", {})


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"", None),
        (b"\x00\x01\x02\xff\xfe\x00PK\x03\x04" * 20, None),
        (
            b"foo,bar,baz\n1,2,3\n",
            "None of the columns foo, bar, baz is known; expected name, phone, email, telegram_id",
        ),
        (b"name,phone,phone\nAna,+34600000001,+34600000002\n", "The column phone appears twice (columns 2 and 3)"),
    ],
    ids=["empty", "binary", "no-known-column", "duplicate-column"],
)
def test_the_import_page_refuses_a_file_it_cannot_import_with_422_under_the_file_input(
    admin: Client, tenant: str, content: bytes, words: str | None
) -> None:
    """A fresh user's report: these answered 200 (and ``foo,bar,baz`` ran "done" with every row failing)."""
    response = admin.post(f"/t/{tenant}/crm/contacts/import/", {"file": SimpleUploadedFile("c.csv", content)})
    assert response.status_code == 422
    html = response.content.decode()
    assert 'id="import-file-error"' in html and 'aria-invalid="true"' in html
    if words:
        assert words in html
    assert "import.file" not in html and "validation_error" not in html
    assert selectors.import_job_list(tenant) == []  # nothing recorded, nothing runs


@pytest.mark.parametrize("page", ["crm/contacts/{}/", "crm/segments/{}/", "crm/contacts/import/{}/"])
@pytest.mark.parametrize("bad", ["x%00y", "a" * 5000], ids=["NUL", "5000 characters"])
def test_a_crm_page_of_an_id_nothing_can_have_is_the_404_page(admin: Client, tenant: str, page: str, bad: str) -> None:
    """Found by a new user: ``/crm/contacts/x%00y/`` answered 422 "Not done: Key: contains control character"."""
    r = admin.get(f"/t/{tenant}/" + page.format(bad))
    assert r.status_code == 404, r.content[:300]
    assert b"does not exist" in r.content and b"Key:" not in r.content
