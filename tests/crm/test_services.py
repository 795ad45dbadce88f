"""CRM services: upsert by identity, consent, erasure with suppression, segments, CSV import/export."""

from __future__ import annotations

import csv
import io

import pytest

from botmesh_admin.clock import now_ms
from botmesh_admin.demo import fixtures_dir
from botmesh_admin.errors import Conflict, NotFound, ValidationError
from botmesh_admin.events import connect_journal, use_journal
from crm import selectors, services
from crm.domain import IdentityTaken
from crm.stores import default_store
from crm.stores.base import ContactStore

FIXTURE = fixtures_dir() / "crm" / "contacts.csv"


def _import(tenant: str, data: bytes | str, filename: str = "contacts.csv"):
    job = services.contact_import_start(tenant, filename=filename, data=data)
    return services.contact_import_run(tenant, job.id)


def _snapshot(tenant: str) -> dict[tuple[str, ...], tuple]:
    """Every contact keyed by its identities, with what an export must keep."""
    return {
        tuple(sorted(i.key for i in c.identities)): (
            c.name,
            c.tags,
            dict(c.attributes),
            {ch: c.consent_status(ch) for ch in ("whatsapp", "telegram", "email")},
        )
        for c in selectors.contact_iter(tenant)
    }


def test_importing_the_fixture_reports_bad_rows_and_merges_ana(crm: str, contact_store: ContactStore) -> None:
    job = _import(crm, FIXTURE.read_bytes())
    assert (job.status, job.total_rows, job.processed) == ("done", 203, 203)
    assert (job.created, job.merged, job.failed_rows) == (201, 1, 1)
    assert [(e["row"], e["field"]) for e in job.errors] == [(204, "phone"), (204, "email"), (204, "marketing_consent")]
    assert len(list(selectors.contact_iter(crm))) == 201
    ana = selectors.contact_find_by_identity(crm, channel="whatsapp", address="57 300 111 2233")
    assert ana is not None and ana.name == "Ana García"
    assert ana.addresses("email") == ["ana@example.com"]
    assert ana.tags == ("recurrente", "vip")
    assert ana.attributes == {"plan": "pro", "city": "Bogotá"}
    assert ana.consent_status("whatsapp") == "granted" and ana.consent["whatsapp"].source == "import"
    assert contact_store.import_data_get(crm, job.id) is None, "the uploaded file is released"


def test_import_merges_into_a_contact_the_inbox_created(memory_crm: str) -> None:
    ana = services.contact_upsert_identity(
        memory_crm, channel="whatsapp", address="573001112233", name="Ana (WhatsApp)", source="inbox"
    )
    job = _import(memory_crm, FIXTURE.read_bytes())
    assert (job.created, job.merged) == (200, 2)
    merged = selectors.contact_get(memory_crm, ana.id)
    assert merged.name == "Ana (WhatsApp)", "an import does not overwrite a name"
    assert merged.addresses("email") == ["ana@example.com"]


def test_upsert_fills_a_missing_name_but_never_overwrites_one(memory_crm: str) -> None:
    c = services.contact_upsert_identity(memory_crm, channel="telegram", address="700001004", source="inbox")
    assert c.name is None
    c = services.contact_upsert_identity(
        memory_crm, channel="telegram", address="700001004", name="Ana", source="inbox"
    )
    assert c.name == "Ana"
    c = services.contact_upsert_identity(memory_crm, channel="telegram", address="700001004", name="X", source="inbox")
    assert c.name == "Ana" and c.version == 2


def test_row_whose_identities_belong_to_two_contacts_is_reported(memory_crm: str) -> None:
    services.contact_create(memory_crm, identities=[{"channel": "whatsapp", "address": "+573001112233"}])
    services.contact_create(memory_crm, identities=[{"channel": "email", "address": "b@example.com"}])
    job = _import(memory_crm, "name,phone,email\nX,3001112233,b@example.com\nY,3001112244,\n")
    assert job.created == 1 and job.failed_rows == 1
    assert job.errors[0]["row"] == 2 and "different contacts" in job.errors[0]["message"]


def test_import_reports_bad_attribute_columns_and_typed_values(memory_crm: str) -> None:
    job = _import(memory_crm, "name;phone;Bad Col;score:json;vip:json\nA;3001112233;x;3;true\nB;3001112244;y;{};1\n")
    assert (job.created, job.failed_rows) == (1, 1)
    assert [(e["row"], e["field"]) for e in job.errors] == [(1, "Bad Col"), (3, "score:json")]
    a = selectors.contact_find_by_identity(memory_crm, channel="whatsapp", address="3001112233")
    assert a.attributes == {"score": 3, "vip": True}


def test_import_reports_a_telegram_id_of_4301_digits_as_a_bad_row_instead_of_failing(memory_crm: str) -> None:
    """Found by a new user: the import stopped with "ValueError" and its journal event went dead."""
    job = _import(memory_crm, f"name;telegram_id\nA;{'9' * 4301}\nB;700001004\n")
    assert (job.created, job.failed_rows) == (1, 1)
    assert [e["row"] for e in job.errors] == [2]


def test_import_reports_a_deeply_nested_json_cell_instead_of_failing(memory_crm: str) -> None:
    """Found by exploratory testing: a ``:json`` cell nested 3000 deep raised RecursionError in the import."""
    deep = "[" * 3000 + "]" * 3000
    job = _import(memory_crm, f"name;phone;score:json\nA;3001112233;{deep}\nB;3001112244;2\n")
    assert (job.created, job.failed_rows) == (1, 1)
    assert [(e["row"], e["field"]) for e in job.errors] == [(2, "score:json")]  # row 1 is the header


def test_export_imports_back_to_the_same_contacts(memory_crm: str, tenant_id: str) -> None:
    _import(memory_crm, FIXTURE.read_bytes())
    c = selectors.contact_find_by_identity(memory_crm, channel="email", address="cliente1@example.com")
    services.contact_update(
        memory_crm,
        c.id,
        expected_version=c.version,
        attributes={
            "score": 3,
            "ratio": 0.25,
            "active": False,
            "note": None,
            "code": "1",
            "formula": "=1+2",
            "pad": " x",
        },
    )
    services.consent_set(memory_crm, c.id, channel="telegram", status="granted", source="test")
    exported = "".join(selectors.contact_export_csv(memory_crm))
    before = _snapshot(memory_crm)
    other = tenant_id + "-copy"
    selectors._regions[other] = ("CO", float("inf"))
    job = _import(other, exported.encode())
    assert job.failed_rows == 0, job.errors
    assert _snapshot(other) == before
    assert "'=1+2" in exported, "cells that look like formulas are escaped"


def test_erasure_keeps_only_a_hashed_suppression_and_blocks_consent_revival(memory_crm: str) -> None:
    _import(memory_crm, FIXTURE.read_bytes())
    ana = selectors.contact_find_by_identity(memory_crm, channel="whatsapp", address="+573001112233")
    services.consent_set(
        memory_crm,
        ana.id,
        channel="whatsapp",
        status="denied",
        source="telegram",
        evidence="telegram: user blocked the bot",
    )
    report = services.contact_erase(memory_crm, ana.id)
    assert (report.identities, report.channels, report.suppressed_channels) == (2, ("whatsapp", "email"), ("whatsapp",))
    assert report.tags == 2 and report.attributes == 2
    with pytest.raises(NotFound):
        selectors.contact_get(memory_crm, ana.id)
    assert selectors.contact_find_by_identity(memory_crm, channel="email", address="ana@example.com") is None
    # the suppression record holds no readable personal data
    record = default_store().suppression_get(memory_crm, services.identity_hash(ana.identities[0]))
    assert record is not None and "573001112233" not in repr(record) and "blocked" not in repr(record)
    # re-import the same phone, with "granted": the opt-out survives
    job = _import(memory_crm, "name,phone,marketing_consent\nAna,57 300 111 2233,granted\n")
    assert job.created == 1 and job.notices and "stays denied" in job.notices[0]["message"]
    revived = selectors.contact_find_by_identity(memory_crm, channel="whatsapp", address="+573001112233")
    assert revived.consent_status("whatsapp") == "denied"
    assert revived.name == "Ana" and revived.addresses("email") == []
    # the inbox re-creating her does not revive it either; an explicit opt-in does, and lifts the entry
    fresh = services.consent_set(
        memory_crm, revived.id, channel="whatsapp", status="granted", source="bot", evidence="user sent START"
    )
    assert fresh.consent_status("whatsapp") == "granted"
    assert default_store().suppression_get(memory_crm, services.identity_hash(ana.identities[0])) is None


def test_api_create_cannot_grant_consent_on_a_suppressed_identity(memory_crm: str) -> None:
    c = services.contact_create(
        memory_crm, identities=[{"channel": "telegram", "address": "42"}], consent={"telegram": {"status": "denied"}}
    )
    services.contact_erase(memory_crm, c.id)
    again = services.contact_create(
        memory_crm, identities=[{"channel": "telegram", "address": "42"}], consent={"telegram": {"status": "granted"}}
    )
    assert again.consent_status("telegram") == "denied"
    again = services.contact_upsert_identity(memory_crm, channel="telegram", address="42", source="inbox")
    assert again.consent_status("telegram") == "denied"


def test_update_with_a_stale_version_conflicts_and_writes_nothing(memory_crm: str) -> None:
    c = services.contact_create(memory_crm, identities=[{"channel": "email", "address": "a@x.co"}], tags=["a"])
    services.contact_update(memory_crm, c.id, expected_version=1, add_tags=["b"])
    with pytest.raises(Conflict) as info:
        services.contact_update(memory_crm, c.id, expected_version=1, add_tags=["c"])
    assert info.value.current_version == 2
    assert selectors.contact_get(memory_crm, c.id).tags == ("a", "b")


def test_bad_input_names_the_field_and_writes_nothing(memory_crm: str) -> None:
    c = services.contact_create(memory_crm, identities=[{"channel": "email", "address": "a@x.co"}])
    cases = [
        (
            lambda: services.contact_create(
                memory_crm,
                identities=[{"channel": "email", "address": "b@x.co"}, {"channel": "whatsapp", "address": "nope"}],
            ),
            "contact.identities[1].address",
        ),
        (lambda: services.contact_create(memory_crm, identities=[]), "contact.identities"),
        (
            lambda: services.contact_update(memory_crm, c.id, expected_version=1, attributes={"Bad": 1}),
            "contact.attributes.Bad",
        ),
        (
            lambda: services.contact_update(memory_crm, c.id, expected_version=1, attributes={"ok": {"x": 1}}),
            "contact.attributes.ok",
        ),
        (
            lambda: services.consent_set(memory_crm, c.id, channel="whatsapp", status="maybe", source="x"),
            "consent.status",
        ),
        (lambda: services.segment_create(memory_crm, name="x", rules={"tags_all": "vip"}), "segment.rules.tags_all"),
    ]
    for call, field in cases:
        with pytest.raises(ValidationError) as info:
            call()
        assert info.value.field == field
    assert [x.id for x in selectors.contact_iter(memory_crm)] == [c.id]
    assert selectors.contact_get(memory_crm, c.id).version == 1
    assert selectors.segment_list(memory_crm) == []


def test_identity_taken_names_the_owner(memory_crm: str) -> None:
    a = services.contact_create(memory_crm, identities=[{"channel": "whatsapp", "address": "+573001112233"}])
    with pytest.raises(IdentityTaken) as info:
        services.contact_create(memory_crm, identities=[{"channel": "whatsapp", "address": "3001112233"}])
    assert info.value.contact_id == a.id and info.value.status == 409


def test_segments_count_strictly_and_preview(memory_crm: str) -> None:
    _import(memory_crm, FIXTURE.read_bytes() + b"Numeric,+57 300 000 0001,,,vip,,,granted\n")
    with_numeric = selectors.contact_find_by_identity(memory_crm, channel="whatsapp", address="+573000000001")
    services.contact_update(memory_crm, with_numeric.id, expected_version=with_numeric.version, attributes={"plan": 1})
    rows = list(csv.DictReader(io.StringIO(FIXTURE.read_text(encoding="utf-8"))))[:-1]
    vip_granted = {r["phone"] for r in rows if "vip" in r["tags"].split(";") and r["marketing_consent"] == "granted"}
    seg = services.segment_create(
        memory_crm, name="VIP with WhatsApp consent", rules={"tags_all": ["vip"], "consent_required": "whatsapp"}
    )
    assert selectors.segment_count(memory_crm, seg.id) == len(vip_granted) + 1
    pro = sum(1 for r in rows if r["plan"] == "pro")
    assert selectors.segment_count(memory_crm, {"attributes": {"plan": "pro"}}) == pro
    assert selectors.segment_count(memory_crm, {"attributes": {"plan": 1}}) == 1
    assert selectors.segment_count(memory_crm, {"attributes": {"plan": "1"}}) == 0
    none_vip = selectors.segment_count(memory_crm, {"tags_none": ["vip"]})
    assert none_vip + selectors.segment_count(memory_crm, {"tags_all": ["vip"]}) == 202
    preview = selectors.segment_preview(memory_crm, seg.id, limit=5)
    assert preview.count == len(vip_granted) + 1 and len(preview.sample) == 5
    assert selectors.segment_counts(memory_crm, [seg])[seg.id] == preview.count
    with pytest.raises(NotFound):
        selectors.segment_count(memory_crm, "s_missing")


def test_contact_list_filters_and_pages(memory_crm: str) -> None:
    _import(memory_crm, FIXTURE.read_bytes())
    seen, after = [], None
    while True:
        page = selectors.contact_list(memory_crm, limit=50, after=after, tag="vip")
        seen += page.items
        if page.next is None:
            break
        after = page.next
    assert len(seen) == len({c.id for c in seen}) and all("vip" in c.tags for c in seen)
    rows = list(csv.DictReader(io.StringIO(FIXTURE.read_text(encoding="utf-8"))))
    assert len(seen) == sum(1 for r in rows[:-2] if "vip" in r["tags"].split(";"))  # Ana's rows merge
    found = selectors.contact_list(memory_crm, q="garcia").items
    assert "Ana García" in [c.name for c in found]
    by_phone = selectors.contact_list(memory_crm, identity="whatsapp:57 300 111 2233").items
    assert [c.name for c in by_phone] == ["Ana García"]
    assert selectors.contact_list(memory_crm, q="300 111 2233").items[0].name == "Ana García"
    with pytest.raises(ValidationError) as info:
        selectors.contact_list(memory_crm, identity="sms:1")
    assert info.value.field == "identity"


def test_an_interrupted_import_resumes_after_its_last_saved_row(memory_crm: str) -> None:
    """A worker killed mid-import leaves the job "running"; once its lease is gone, a new run resumes it."""
    from dataclasses import replace

    text = FIXTURE.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    first_50 = _import(memory_crm, "".join(lines[:51]))  # the dead worker got this far
    assert first_50.created == 50
    job = services.contact_import_start(memory_crm, filename="contacts.csv", data=text)
    store = default_store()
    store.import_job_replace(
        memory_crm,
        replace(job, status="running", processed=50, created=50),  # no journal lease holds it any more
        expected_version=job.version,
    )
    busy = store.import_job_get(memory_crm, job.id)
    assert services.contact_import_run(memory_crm, job.id).status == "done"
    done = selectors.import_job_get(memory_crm, job.id)
    assert (done.processed, done.created, done.merged, done.failed_rows) == (203, 201, 1, 1)
    assert len(list(selectors.contact_iter(memory_crm))) == 201
    assert busy.status == "running"


def test_a_job_another_worker_is_running_is_left_alone(memory_crm: str, db: None) -> None:
    from dataclasses import replace

    job = services.contact_import_start(memory_crm, filename="a.csv", data="name,phone\nA,3001112233\n")
    store = default_store()
    with use_journal(connect_journal("memory://")) as journal:
        event = services.contact_import_queue(memory_crm, job.id)
        held = journal.claim(now_ms(), 60_000, event.channel)  # another worker's live lease
        assert held is not None and held.id == event.id
        store.import_job_replace(
            memory_crm, replace(job, status="running", event_id=held.id), expected_version=job.version
        )
        assert services.contact_import_run(memory_crm, job.id).status == "running"
    assert list(selectors.contact_iter(memory_crm)) == []
