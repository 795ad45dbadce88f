"""``/api/v1/tenants/{tenant}/contacts`` and ``/segments`` through Django's test client."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import Client

from botmesh_admin.celery import app as celery_app
from botmesh_admin.demo import fixtures_dir
from botmesh_admin.tenancy import services as tenancy

FIXTURE = fixtures_dir() / "crm" / "contacts.csv"


class Api:
    """A client holding one tenant's bearer token."""

    def __init__(self, tenant: str, token: str) -> None:
        self.tenant, self.client = tenant, Client(HTTP_AUTHORIZATION=f"Bearer {token}")

    def url(self, path: str) -> str:
        return f"/api/v1/tenants/{self.tenant}/{path}"

    def get(self, path: str, **params):
        return self.client.get(self.url(path), params)

    def post(self, path: str, body=None, **kw):
        return self.client.post(self.url(path), body, content_type=kw.pop("content_type", "application/json"), **kw)

    def patch(self, path: str, body):
        return self.client.patch(self.url(path), body, content_type="application/json")

    def delete(self, path: str):
        return self.client.delete(self.url(path))


@pytest.fixture
def eager_celery(transactional_db: None) -> Iterator[None]:
    """Run Celery tasks in the calling thread (no worker in these tests).

    Without a test transaction around it, the journal's drain queued after a
    commit (an import's ``crm.import`` event) runs at once, as in a request.
    """
    previous = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = previous


def _tenant(tenant: str, role: str = "admin") -> Api:
    tenancy.tenant_create(tenant, name=tenant.upper())
    _, plaintext = tenancy.token_create(tenant, name=f"{role}-token", role=role)
    return Api(tenant, plaintext)


@pytest.fixture
def api(db, tenant_id: str, eager_celery: None) -> Api:
    return _tenant(tenant_id)


ANA = {
    "name": "Ana",
    "identities": [
        {"channel": "whatsapp", "address": "57 300 111 2233"},
        {"channel": "email", "address": "Ana@Example.com"},
    ],
    "tags": ["VIP"],
    "attributes": {"plan": "pro", "score": 3},
    "consent": {"whatsapp": {"status": "granted"}},
}


def test_create_get_and_find_a_contact_by_identity(api: Api) -> None:
    r = api.post("contacts", ANA)
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["identities"] == [
        {"channel": "whatsapp", "address": "+573001112233"},
        {"channel": "email", "address": "ana@example.com"},
    ]
    assert body["tags"] == ["vip"] and body["version"] == 1
    assert body["consent"]["whatsapp"]["status"] == "granted"
    assert body["conversations_url"] == f"/t/{api.tenant}/inbox/?contact={body['id']}"
    assert api.get(f"contacts/{body['id']}").json()["name"] == "Ana"
    found = api.get("contacts", identity="whatsapp:+573001112233").json()
    assert [c["id"] for c in found["items"]] == [body["id"]]
    dup = api.post("contacts", {"identities": [{"channel": "whatsapp", "address": "3001112233"}]})
    assert dup.status_code == 409 and dup.json()["error"] == "identity_taken"
    assert dup.json()["contact_id"] == body["id"]


def test_a_field_an_identity_does_not_have_is_a_422_naming_it_and_nothing_is_created(api: Api) -> None:
    """A fresh user's report: ``{"channel", "address", "verified", "bogus"}`` was a 201, two fields dropped."""
    identity = {"channel": "email", "address": "x1@example.com", "verified": True}
    r = api.post("contacts", {"identities": [{"channel": "email", "address": "x0@example.com"}, identity]})
    assert r.status_code == 422 and r.json()["field"].endswith("identities[1].verified"), r.content
    assert "only channel and address" in r.json()["message"]
    assert api.get("contacts", identity="email:x0@example.com").json()["items"] == []


def test_update_with_stale_version_is_409_with_current_version(api: Api) -> None:
    cid = api.post("contacts", ANA).json()["id"]
    r = api.patch(f"contacts/{cid}", {"expected_version": 1, "add_tags": ["nuevo"], "attributes": {"score": None}})
    assert r.status_code == 200 and r.json()["tags"] == ["nuevo", "vip"] and r.json()["attributes"]["score"] is None
    stale = api.patch(f"contacts/{cid}", {"expected_version": 1, "name": "B"})
    assert stale.status_code == 409 and stale.json()["current_version"] == 2
    assert api.get(f"contacts/{cid}").json()["name"] == "Ana"


@pytest.mark.parametrize(
    "body,field",
    [
        (
            {"identities": [{"channel": "email", "address": "ok@x.co"}, {"channel": "whatsapp", "address": "nope"}]},
            "contact.identities[1].address",
        ),
        (
            {"identities": [{"channel": "email", "address": "ok@x.co"}], "attributes": {"Plan": 1}},
            "contact.attributes.Plan",
        ),
        (
            {"identities": [{"channel": "email", "address": "ok@x.co"}], "attributes": {"p": [1]}},
            "contact.attributes.p",
        ),
        ({"identities": [{"channel": "email", "address": "ok@x.co"}], "tags": ["ok", ""]}, "contact.tags[1]"),
        (
            {"identities": [{"channel": "email", "address": "ok@x.co"}], "consent": {"email": {"status": "maybe"}}},
            "contact.consent.email.status",
        ),
        ({"name": "no identities"}, "identities"),
    ],
)
def test_bad_contact_is_422_with_the_field_path_and_writes_nothing(api: Api, body: dict, field: str) -> None:
    r = api.post("contacts", body)
    assert r.status_code == 422, r.content
    assert r.json()["field"] == field
    assert api.get("contacts").json()["items"] == []


def test_bad_update_is_422_and_writes_nothing(api: Api) -> None:
    cid = api.post("contacts", ANA).json()["id"]
    r = api.patch(f"contacts/{cid}", {"expected_version": 1, "add_tags": ["fine"], "attributes": {"x": {"a": 1}}})
    assert r.status_code == 422 and r.json()["field"] == "contact.attributes.x"
    assert api.patch(f"contacts/{cid}", {"add_tags": ["x"]}).status_code == 422  # expected_version is required
    got = api.get(f"contacts/{cid}").json()
    assert got["version"] == 1 and got["tags"] == ["vip"]


def test_list_pages_with_cursor_and_filters(api: Api) -> None:
    for i in range(5):
        api.post(
            "contacts",
            {
                "name": f"P{i}",
                "identities": [{"channel": "telegram", "address": str(100 + i)}],
                "tags": ["even"] if i % 2 == 0 else [],
            },
        )
    first = api.get("contacts", limit=2).json()
    second = api.get("contacts", limit=2, after=first["next"]).json()
    third = api.get("contacts", limit=2, after=second["next"]).json()
    assert [c["name"] for c in first["items"] + second["items"] + third["items"]] == [f"P{i}" for i in range(5)]
    assert third["next"] is None
    assert [c["name"] for c in api.get("contacts", tag="even").json()["items"]] == ["P0", "P2", "P4"]
    assert [c["name"] for c in api.get("contacts", q="p3").json()["items"]] == ["P3"]
    assert api.get("contacts", limit=500).status_code == 422


def test_list_filters_by_consent_and_searches_by_phone_digits(api: Api) -> None:
    """Issue 16: consent per channel is a list filter; a phone typed nationally finds its contact."""
    ana = api.post("contacts", ANA).json()
    api.post("contacts", {"name": "Luis", "identities": [{"channel": "telegram", "address": "700"}]})
    assert [c["id"] for c in api.get("contacts", consent="whatsapp:granted").json()["items"]] == [ana["id"]]
    assert [c["name"] for c in api.get("contacts", consent="whatsapp:unknown").json()["items"]] == ["Luis"]
    assert [c["id"] for c in api.get("contacts", q="300 111").json()["items"]] == [ana["id"]]
    r = api.get("contacts", consent="whatsapp:maybe")
    assert r.status_code == 422 and r.json()["field"] == "consent"


def test_consent_endpoint_and_erasure_report(api: Api) -> None:
    cid = api.post("contacts", ANA).json()["id"]
    r = api.post(
        f"contacts/{cid}/consent",
        {"channel": "whatsapp", "status": "denied", "evidence": "telegram: user blocked the bot"},
    )
    assert r.status_code == 200 and r.json()["consent"]["whatsapp"]["source"] == "token:admin-token"
    erased = api.delete(f"contacts/{cid}")
    assert erased.status_code == 200
    assert erased.json() == {
        "contact_id": cid,
        "erased": True,
        "identities": 2,
        "channels": ["whatsapp", "email"],
        "tags": 1,
        "attributes": 2,
        "consent_records": 2,
        "suppressed_channels": ["whatsapp"],
        "conversations": 0,  # none linked: a contact created through the API
    }
    assert api.get(f"contacts/{cid}").status_code == 404
    assert api.delete(f"contacts/{cid}").status_code == 404


def test_import_upload_reports_rows_and_export_round_trips(api: Api, db, tenant_id: str, eager_celery) -> None:
    r = api.post("contacts/imports", FIXTURE.read_bytes(), content_type="text/csv", HTTP_X_FILENAME="contacts.csv")
    assert r.status_code == 202, r.content
    job = api.get(f"contacts/imports/{r.json()['id']}").json()
    assert (job["status"], job["created"], job["merged"], job["failed_rows"], job["percent"]) == (
        "done",
        201,
        1,
        1,
        100,
    )
    assert [(e["row"], e["field"]) for e in job["errors"]] == [
        (204, "phone"),
        (204, "email"),
        (204, "marketing_consent"),
    ]
    assert api.get("contacts/imports").json()[0]["id"] == job["id"]
    export = api.get("contacts/export")
    assert export["Content-Type"].startswith("text/csv")
    text = b"".join(export.streaming_content)
    copy = _tenant(tenant_id + "-copy")
    from django.core.files.uploadedfile import SimpleUploadedFile

    r2 = copy.client.post(copy.url("contacts/imports"), {"file": SimpleUploadedFile("export.csv", text)})
    assert r2.status_code == 202, r2.content
    job2 = copy.get(f"contacts/imports/{r2.json()['id']}").json()
    assert (job2["created"], job2["failed_rows"]) == (201, 0)
    key = lambda c: sorted((i["channel"], i["address"]) for i in c["identities"])  # noqa: E731
    strip = lambda c: (key(c), c["name"], c["tags"], c["attributes"], {k: v["status"] for k, v in c["consent"].items()})  # noqa: E731

    def everything(a: Api) -> list:
        return sorted(
            (
                strip(c)
                for c in a.get("contacts", limit=200).json()["items"]
                + a.get("contacts", limit=200, after=a.get("contacts", limit=200).json()["next"]).json()["items"]
            ),
            key=repr,
        )

    assert everything(copy) == everything(api)


def test_empty_upload_is_422(api: Api) -> None:
    r = api.post("contacts/imports", b"", content_type="text/csv")
    assert r.status_code == 422 and r.json()["field"] == "file"


def _multipart(parts: list[tuple[str, str, bytes]], boundary: str | None = "XyZ") -> tuple[bytes, str]:
    """Return a multipart/form-data body of (field, filename, data) parts and its Content-Type."""
    b = boundary or "XyZ"
    body = (
        b"".join(
            f'--{b}\r\nContent-Disposition: form-data; name="{field}"; filename="{name}"\r\n'
            f"Content-Type: text/csv\r\n\r\n".encode()
            + data
            + b"\r\n"
            for field, name, data in parts
        )
        + f"--{b}--\r\n".encode()
    )
    return body, "multipart/form-data" + (f"; boundary={boundary}" if boundary else "")


@pytest.mark.parametrize("case", ["field_not_named_file", "no_boundary", "101_files", "two_files"])
def test_malformed_uploads_are_a_json_4xx_naming_the_problem(api: Api, case: str) -> None:
    """Issue 18, item 1: each of these answered 500 (the handler read ``request.body`` after the parser)."""
    csv = b"name,phone\nAna,+573001112233\n"
    parts = {
        "field_not_named_file": [("upload", "a.csv", csv)],
        "no_boundary": [("file", "a.csv", csv)],
        "101_files": [("file", f"{i}.csv", csv) for i in range(101)],
        "two_files": [("file", "a.csv", csv), ("file", "b.csv", csv)],
    }[case]
    body, content_type = _multipart(parts, boundary=None if case == "no_boundary" else "XyZ")
    r = api.post("contacts/imports", body, content_type=content_type)
    expected = {
        "field_not_named_file": (422, "file", "multipart field 'file' (got 'upload')"),
        "no_boundary": (400, "body", "boundary"),
        "101_files": (400, None, "files"),
        "two_files": (422, "file", "one CSV per import (2 files"),
    }[case]
    assert r["Content-Type"].startswith("application/json"), r.content
    assert (r.status_code, r.json()["field"]) == expected[:2], r.json()
    assert expected[2] in r.json()["message"]
    assert api.get("contacts/imports").json() == [], "nothing was imported"


@pytest.mark.parametrize("content_type", ["application/json", "application/x-www-form-urlencoded", ""])
def test_import_with_another_content_type_is_415_naming_the_accepted_bodies(api: Api, content_type: str) -> None:
    """Issue 24, item 1: a JSON body answered 202 and was imported as "upload.csv"."""
    body = b'{"file": "name,phone\\nAna,+573001112233\\n"}'
    r = api.client.generic("POST", api.url("contacts/imports"), body, content_type=content_type)
    assert r.status_code == 415, r.content
    assert r["Content-Type"].startswith("application/json")
    assert r.json()["error"] == "unsupported_media_type" and r.json()["field"] == "file"
    message = r.json()["message"]
    assert "multipart/form-data" in message and "'file'" in message and "text/csv" in message
    assert (content_type or "no Content-Type") in message
    assert api.get("contacts/imports").json() == [], "nothing was imported"


NAMES_CSV = "name,email,city\r\nJosé Ñandú,jose@example.com,São Paulo\r\nZoë 李,zoe@example.com,Kraków\r\n"


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16", "utf-16-le+bom", "utf-16-be+bom", "cp1252"])
def test_import_decodes_utf8_utf16_with_bom_and_windows_1252(api: Api, encoding: str) -> None:
    """Issue 24, item 2: a UTF-16 file (Excel's "Unicode Text") ended "done" with 0 rows and a garbled header."""
    text = NAMES_CSV if encoding != "cp1252" else NAMES_CSV.replace("李", "Li")
    if encoding.endswith("+bom"):
        data = "\ufeff".encode(encoding[:-4]) + text.encode(encoding[:-4])
    else:
        data = text.encode(encoding)
    r = api.post("contacts/imports", data, content_type="text/csv")
    assert r.status_code == 202, r.content
    job = api.get(f"contacts/imports/{r.json()['id']}").json()
    assert (job["status"], job["created"], job["failed_rows"], job["errors"]) == ("done", 2, 0, [])
    contacts = sorted(api.get("contacts").json()["items"], key=lambda c: c["name"])
    assert [(c["name"], c["attributes"]) for c in contacts] == [
        ("José Ñandú", {"city": "São Paulo"}),
        (text.split("\r\n")[2].split(",")[0], {"city": "Kraków"}),
    ]


UNDECODABLE = [
    ("utf16_without_bom", NAMES_CSV.encode("utf-16-le"), "NUL character"),
    ("utf16_bom_odd_length", b"\xff\xfe" + "name,email\n".encode("utf-16-le") + b"a", "not valid UTF-16"),
    ("utf8_bom_then_invalid", b"\xef\xbb\xbfname,email\n\xc3(\n", "not valid UTF-8"),
    ("not_utf8_nor_1252", b"name,email\nJos\xe9 \x81,j@example.com\n", "neither UTF-8 nor Windows-1252"),
    ("xlsx_workbook", b"PK\x03\x04\x14\x00\x06\x00", "workbook"),
]


@pytest.mark.parametrize(("case", "data", "says"), UNDECODABLE, ids=[case for case, _, _ in UNDECODABLE])
def test_import_refuses_an_undecodable_file_with_422_naming_the_encoding(
    api: Api, case: str, data: bytes, says: str
) -> None:
    """Issue 24, item 2: an undecodable file is refused before a job exists, never "done" with 0 rows."""
    r = api.post("contacts/imports", data, content_type="text/csv")
    assert (r.status_code, r.json()["field"]) == (422, "file"), r.content
    assert says in r.json()["message"]
    assert api.get("contacts/imports").json() == [], "no job was recorded"


def test_an_import_report_cuts_a_column_name_the_client_wrote_to_200_characters(api: Api) -> None:
    """A fresh user's report: a header of a 20,000-character column came back whole in ``errors[0].field``."""
    long = "x" * 20_000
    r = api.post("contacts/imports", f"name,email,{long}\nAna,ana@example.com,1\n".encode(), content_type="text/csv")
    assert r.status_code == 202, r.content
    job = api.get(f"contacts/imports/{r.json()['id']}").json()
    reported = [e for e in job["errors"] + job.get("notices", []) if long[:50] in (e.get("field") or "") + e["message"]]
    assert reported, job
    for entry in reported:
        assert len(entry.get("field") or "") <= 200 and len(entry["message"]) <= 500, entry


def test_import_reports_a_row_with_more_columns_than_the_header(api: Api) -> None:
    """Issue 24, item 3: "Too Many,...,extra,extra" was imported and its extra values silently dropped."""
    csv = (
        "name,email,city\n"
        "Ana,ana@example.com,Bogotá\n"
        "Too Many,too@example.com,Lima,extra,extra\n"
        "Bo,bo@example.com,Quito,,\n"
    ).encode()
    r = api.post("contacts/imports", csv, content_type="text/csv")
    assert r.status_code == 202, r.content
    job = api.get(f"contacts/imports/{r.json()['id']}").json()
    assert (job["status"], job["created"], job["failed_rows"]) == ("done", 2, 1)
    assert job["errors"] == [
        {
            "row": 3,
            "field": None,
            "message": "the row has 5 columns but the header has 3; the values after column 3 have no column name",
        }
    ]
    assert sorted(c["name"] for c in api.get("contacts").json()["items"]) == ["Ana", "Bo"], (
        "the bad row is not imported"
    )


def test_segments_crud_count_and_preview(api: Api) -> None:
    for i, plan in enumerate(["1", 1, True, "pro"]):
        api.post(
            "contacts",
            {
                "name": f"P{i}",
                "identities": [{"channel": "telegram", "address": str(10 + i)}],
                "attributes": {"plan": plan},
                "tags": ["vip"],
            },
        )
    r = api.post("segments", {"name": "Plan one", "rules": {"attributes": {"plan": 1}, "tags_all": ["vip"]}})
    assert r.status_code == 201, r.content
    sid = r.json()["id"]
    assert api.get(f"segments/{sid}/count").json() == {"count": 1}
    assert api.get(f"segments/{sid}").json()["count"] == 1  # the detail says it too (it said null)
    preview = api.get(f"segments/{sid}/preview", limit=5).json()
    assert preview["count"] == 1 and [c["name"] for c in preview["items"]] == ["P1"]
    unsaved = api.post("segments/preview", {"rules": {"attributes": {"plan": "1"}}}).json()
    assert [c["name"] for c in unsaved["items"]] == ["P0"]
    assert api.get("segments", counts="true").json()[0]["count"] == 1
    bad = api.post("segments", {"name": "x", "rules": {"attributes": {"plan": [1]}}})
    assert bad.status_code == 422 and bad.json()["field"] == "segment.rules.attributes.plan"
    upd = api.patch(f"segments/{sid}", {"expected_version": 1, "rules": {"attributes": {"plan": True}}})
    assert upd.status_code == 200 and api.get(f"segments/{sid}/count").json() == {"count": 1}
    assert api.patch(f"segments/{sid}", {"expected_version": 1, "name": "y"}).status_code == 409
    assert api.delete(f"segments/{sid}").status_code == 204
    assert api.get(f"segments/{sid}").status_code == 404
    assert len(api.get("segments").json()) == 0
