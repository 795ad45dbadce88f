"""Drive one installation from a subprocess (its stores come from the environment).

``python -m tests.backup.site fill``    migrate, then add demo-like data through the package services
``python -m tests.backup.site writer``  keep writing (contacts, journal records) until stdin closes;
                                        prints the number of each finished write
``python -m tests.backup.site dump``    print every stored thing as JSON: Django rows, every Kv
                                        entry, every journal record, and what the selectors show

Kept free of pytest so it starts quickly.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
from typing import Any

DEMO, WRITER = "tienda", "writer"


def setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "botmesh_admin.settings")
    import django

    django.setup()


def plain(obj: Any) -> Any:
    """Return ``obj`` as JSON-able data (dataclasses, named tuples, enums, sets)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return {name: plain(getattr(obj, name)) for name in obj._fields}
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = [plain(v) for v in obj]
        return sorted(items, key=repr) if isinstance(obj, (set, frozenset)) else items
    if hasattr(obj, "value") and hasattr(obj, "name") and type(obj).__module__ != "builtins":
        return plain(obj.value)
    return obj


def fill() -> None:
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    import crm.services as crm
    import deployments.services as deployments
    import hub.services as hub
    import inbox.services as inbox
    from botmesh_admin.demo import fixtures_dir
    from botmesh_admin.events.runtime import default_journal
    from botmesh_admin.events.services import event_publish
    from botmesh_admin.tenancy import services as tenancy
    from campaigns import services as campaigns

    call_command("migrate", interactive=False, verbosity=0)
    fixtures = fixtures_dir()
    user = get_user_model()(username="admin")
    user.set_password("backup-password-1")
    user.save()
    for tenant in (DEMO, WRITER):
        tenancy.tenant_create(tenant, name=tenant.title(), default_region="CO")
        tenancy.membership_set(tenant, username="admin", role="admin")
    tenancy.token_create(DEMO, name="ci", created_by="admin")

    job = crm.contact_import_start(DEMO, filename="contacts.csv", data=(fixtures / "crm/contacts.csv").read_bytes())
    crm.contact_import_run(DEMO, job.id)
    segment = crm.segment_create(DEMO, name="Promo", rules={"tags_all": ["vip"]})
    campaigns.campaign_create(DEMO, name="Noviembre", segment_id=segment.id, channel="whatsapp",
                              message={"template": "promo_nov", "language": "es"}, actor="admin")  # fmt: skip

    lines = (fixtures / "ledger/messages.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines if '"tienda"' in line][:150]
    for record in records:
        inbox.message_project(DEMO, record)
    rows = conversation_rows(DEMO)
    conversation = rows[0]["conversation"]
    inbox.note_add(DEMO, conversation["id"], author="admin", text="llamar mañana")
    inbox.conversation_assign(DEMO, conversation["id"], agent="admin", expected_version=conversation["version"])

    for name in ("minimal.json", "order-status.json"):
        hub.plugin_install(DEMO, manifest=(fixtures / "hub/valid" / name).read_bytes(), actor="admin")
    for n in (1, 2, 3):
        spec = json.loads((fixtures / f"deployments/version_{n}.json").read_text(encoding="utf-8"))
        deployments.version_publish(DEMO, spec=spec, actor="ci")

    journal = default_journal()
    for i in range(6):
        event_publish(DEMO, type="backup.sample", payload={"i": i, "text": "¿sí?"}, idempotency_key=f"sample-{i}")
    for _ in range(2):  # two done, one failed once (pending, with an error), the rest pending
        r = journal.claim(journal.clock(), 60_000)
        journal.ack(r.id, journal.clock(), r.fencing_token)
    r = journal.claim(journal.clock(), 60_000)
    journal.fail(r.id, journal.clock(), r.fencing_token, "provider said 131047")
    print(json.dumps({"messages": len(records)}))


def writer() -> None:
    """Write a contact and a journal record per step until stdin closes; print each step's number."""
    import crm.services as crm
    from botmesh_admin.events.services import event_publish

    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    i = 0
    while not stop.is_set():
        crm.contact_create(WRITER, identities=[{"channel": "email", "address": f"w{i:05d}@example.com"}],
                           name=f"w{i:05d}", source="writer")  # fmt: skip
        event_publish(WRITER, type="writer.tick", payload={"n": i}, idempotency_key=f"tick-{i:05d}")
        print(i, flush=True)
        i += 1


def conversation_rows(tenant: str) -> list[dict[str, Any]]:
    from inbox import selectors

    rows: list[dict[str, Any]] = []
    after = None
    while True:
        page, after = selectors.conversation_list(tenant, agent="admin", limit=200, after=after)
        rows += plain(page)
        if after is None:
            return rows


def dump_views(tenant: str = DEMO) -> dict[str, Any]:
    """What a user of ``tenant`` sees: conversations with messages and notes, contacts, …"""
    import crm.selectors as crm
    import deployments.selectors as deployments
    import hub.selectors as hub
    from campaigns import selectors as campaigns
    from inbox import selectors as inbox

    conversations = []
    for row in conversation_rows(tenant):
        conv_id = row["conversation"]["id"]
        messages, after = [], None
        while True:
            page, after = inbox.message_list(tenant, conv_id, after=after, limit=200)
            messages += plain(page)
            if after is None:
                break
        notes, _ = inbox.note_list(tenant, conv_id, limit=200)
        conversations.append({**row, "messages": messages, "notes": plain(notes)})
    bots = plain(deployments.bot_list(tenant, limit=200))
    return {
        "conversations": conversations,
        "contacts": sorted(plain(list(crm.contact_iter(tenant))), key=lambda c: c["id"]),
        "segments": plain(crm.segment_list(tenant)),
        "campaigns": plain(campaigns.campaign_list(tenant, limit=200).items),
        "plugins": plain(hub.plugin_list(tenant, limit=200)),
        "bots": bots,
        "versions": {b["bot"]: plain(deployments.version_list(tenant, b["bot"], limit=200)) for b in bots},
    }


def dump() -> None:
    from django.contrib.auth import get_user_model

    from botmesh_admin.channels.models import ChannelConfig
    from botmesh_admin.events.runtime import default_journal
    from botmesh_admin.kv.runtime import default_kv
    from botmesh_admin.tenancy.models import ApiToken, Membership, Tenant

    def rows(model: Any) -> list[dict[str, Any]]:
        return json.loads(json.dumps(list(model.objects.order_by("pk").values()), default=str))

    kv = default_kv()
    tables: dict[str, list[Any]] = {}
    for table in kv.tables():
        entries, after = [], None
        while page := kv.scan(table, after=after, limit=1000):
            entries += [[e.key, e.value, e.version, e.expires_at] for e in page]
            after = page[-1].key
        tables[table] = entries
    journal = default_journal()
    records, after = [], None
    while page := journal.export_records(after=after, limit=1000):
        records += plain(page)
        after = page[-1].id
    doc = {
        "django": {
            "tenants": rows(Tenant),
            "memberships": rows(Membership),
            "tokens": rows(ApiToken),
            "users": rows(get_user_model()),
            "channels": rows(ChannelConfig),
        },  # fmt: skip
        "kv": tables,
        "journal": records,
        "fencing_counter": journal.fencing_counter(),
        "views": dump_views(),
    }
    json.dump(doc, sys.stdout, ensure_ascii=False, sort_keys=True)


if __name__ == "__main__":
    setup()
    {"fill": fill, "writer": writer, "dump": dump}[sys.argv[1]]()
