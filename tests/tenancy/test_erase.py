"""Tenant erasure (issue 15, item 9): ``botmesh_tenant erase <id> --yes`` and the admin API.

Before: there was no erasure at all (``botmesh_tenant`` knew only ``create``).
Each test seeds two tenants the same way — Django rows (channel, token,
membership), journal records, Kv tables of every package (records, declared
index entries, a campaign's delivery table, traces, metrics samples) and the
campaigns' cross-tenant due-index — erases one and checks that nothing of it
is left and nothing of the other was touched.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client

from botmesh_admin.channels.models import ChannelConfig
from botmesh_admin.events import EventJournal, connect_journal, default_journal
from botmesh_admin.events.base import Envelope
from botmesh_admin.kv import DurableKv, Put, TenantKv, connect
from botmesh_admin.kv.runtime import use_kv
from botmesh_admin.observability.stores.kv import KvBotMetricsStore, KvTraceStore
from botmesh_admin.tenancy import services
from botmesh_admin.tenancy.models import ApiToken, Membership, Tenant
from campaigns.stores.kv import KvCampaignStore
from tests.backends import unique_id
from tests.events import journals

ROOT = Path(__file__).resolve().parent.parent.parent
TABLES = [
    ("inbox", "conversations"),
    ("inbox", "messages"),
    ("crm", "contacts"),
    ("crm", "imports"),
    ("campaigns", "campaigns"),
    ("campaigns", "d-cmp_1"),
    ("campaigns", "throttle"),
    ("hub", "installs"),
    ("deployments", "versions"),
]


def seed_kv(kv: DurableKv, tenant: str, *, campaign_tables: int = 0) -> list[str]:
    """Write the tenant's data into every package's Kv tables; return the tables written."""
    written = []
    for package, collection in TABLES:
        table = TenantKv(kv, package).table(tenant, collection)
        kv.commit(table, [Put("r1", {"n": 1}), Put("x/by_state/0001/r1", {}), Put("x/~meta/by_state", "built")])
        written.append(table)
    for n in range(campaign_tables):
        table = TenantKv(kv, "campaigns").table(tenant, f"d-cmp_{n:04d}")
        kv.commit(table, [Put("d/r1", {"state": "sent"})])
        written.append(table)
    KvBotMetricsStore(kv).push(
        tenant, bot="shop", replica="r1", snapshot={"errors": 0}, received_at_ms=int(time.time() * 1000)
    )
    span = {
        "trace_id": "ab" * 16,
        "span_id": "cd" * 8,
        "parent_id": None,
        "name": "POST webhooks/telegram",
        "kind": "server",
        "start_ms": time.time() * 1000,
        "duration_ms": 3.0,
        "status": "ok",
        "status_message": None,
        "attributes": {},
        "events": [],
        "scope": "botmesh_admin",
        "service": "test",
    }
    KvTraceStore(kv).record(tenant, [span])
    written += [TenantKv(kv, "observability").table(tenant, c) for c in ("bot_metrics", "traces")]
    KvCampaignStore(kv).index_put(tenant, "cmp_1", state="scheduled", at=1)
    return written


def seed_rows(tenant: str) -> None:
    services.tenant_create(tenant, name=tenant)
    user = get_user_model().objects.create_user(f"u-{tenant}", password="pw-123456789")
    services.membership_set(tenant, username=user.get_username(), role="admin")
    services.token_create(tenant, name="ci")
    ChannelConfig.objects.create(tenant_id=tenant, kind="telegram", name="shop")


def seed_journal(journal: EventJournal, tenant: str, records: int = 5) -> None:
    for n in range(records):
        journal.append(Envelope(type="inbox.message", tenant=tenant, payload={"n": n}, idempotency_key=f"k{n}"))


def snapshot(
    kv: DurableKv, journal: EventJournal, tenant: str, tables: list[str], *, listed: bool = False
) -> dict[str, Any]:
    """What a user could still find of ``tenant``: rows, records, entries, index entries (and tables listed)."""
    index = [e.key for e in kv.scan("campaigns/~system/index", prefix=f"{tenant}!", limit=100)]
    return {
        "rows": [
            Tenant.objects.filter(id=tenant).count(),
            ApiToken.objects.filter(tenant_id=tenant).count(),
            Membership.objects.filter(tenant_id=tenant).count(),
            ChannelConfig.objects.filter(tenant_id=tenant).count(),
        ],
        "journal": sorted(r.idempotency_key for r in journal.list(tenant=tenant, limit=200)),
        "counts": journal.counts(tenant),
        "entries": {t: [(e.key, e.value) for e in kv.scan(t, limit=100)] for t in tables},
        "due-index": index,
        **(
            {
                "listed": [
                    t
                    for package in ("inbox", "crm", "campaigns", "hub", "deployments", "observability")
                    for t in kv.tables(f"{package}/{tenant}/")
                ]
            }
            if listed
            else {}
        ),  # type: ignore[attr-defined]
    }


NOTHING = {"rows": [0, 0, 0, 0], "journal": [], "counts": {}, "due-index": [], "listed": []}


@pytest.mark.django_db
def test_erase_leaves_nothing_of_the_tenant_and_touches_no_other(any_kv: DurableKv) -> None:
    gone, kept = unique_id("gone"), unique_id("kept")
    journal = default_journal()
    with use_kv(any_kv):
        tables = {t: seed_kv(any_kv, t) for t in (gone, kept)}
        for tenant in (gone, kept):
            seed_rows(tenant)
            seed_journal(journal, tenant)
        before = snapshot(any_kv, journal, kept, tables[kept])
        out = io.StringIO()
        call_command("botmesh_tenant", "erase", gone, "--yes", stdout=out)
        after = snapshot(any_kv, journal, gone, tables[gone], listed=True)
        assert {k: v for k, v in after.items() if k != "entries"} == NOTHING
        assert after["entries"] == {t: [] for t in tables[gone]}
        assert snapshot(any_kv, journal, kept, tables[kept]) == before
        printed = out.getvalue()
        assert "1 channels, 1 API tokens, 1 memberships removed" in printed
        assert "journal: 5 records removed" in printed
        assert f"kv: dropped crm/{gone}/contacts" in printed and f"kv: dropped observability/{gone}/traces" in printed
        assert "campaigns due-index entries: 1" in printed and "tenant: 1" in printed
        again = io.StringIO()
        call_command("botmesh_tenant", "erase", gone, "--yes", stdout=again)  # idempotent
        assert "journal records: 0; kv tables: 0" in again.getvalue()
        call_command("botmesh_tenant", "erase", kept, "--yes", stdout=io.StringIO())  # the shared servers


@pytest.mark.django_db
def test_erase_needs_yes_and_never_touches_a_kernel_namespace() -> None:
    services.tenant_create("acme", name="ACME")
    with pytest.raises(CommandError, match="pass --yes"):
        call_command("botmesh_tenant", "erase", "acme", stdout=io.StringIO())
    assert Tenant.objects.filter(id="acme").exists()
    with pytest.raises(CommandError, match="^tenant: 'system' is reserved"):
        call_command("botmesh_tenant", "erase", "system", "--yes", stdout=io.StringIO())


@pytest.mark.django_db
def test_admin_api_erases_with_a_typed_confirmation() -> None:
    gone = unique_id("gone")
    seed_rows(gone)
    get_user_model().objects.create_user("agent-1", password="pw-123456789")
    services.membership_set(gone, username="agent-1", role="agent")
    _, admin_token = services.token_create(gone, name="admin")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {admin_token}"}
    client = Client()
    agent = Client()
    agent.login(username="agent-1", password="pw-123456789")
    refused = agent.post(f"/api/v1/tenants/{gone}/erase", {"confirm": gone}, content_type="application/json")
    assert refused.status_code == 403
    wrong = client.post(f"/api/v1/tenants/{gone}/erase", {"confirm": "acme"}, content_type="application/json", **auth)
    assert wrong.status_code == 422 and wrong.json()["field"] == "confirm"
    assert Tenant.objects.filter(id=gone).exists()
    done = client.post(f"/api/v1/tenants/{gone}/erase", {"confirm": gone}, content_type="application/json", **auth)
    assert done.status_code == 200, done.content
    assert done.json()["removed"]["api tokens"] == 2 and done.json()["removed"]["tenant"] == 1
    assert not Tenant.objects.filter(id=gone).exists()
    assert client.get(f"/api/v1/tenants/{gone}/whoami", **auth).status_code == 401  # the token went with it
    from botmesh_admin.kv.runtime import default_kv

    time.sleep(0.5)  # the request's own trace is written once it ends
    assert default_kv().tables(f"observability/{gone}/") == []  # type: ignore[attr-defined]


def _manage(env: dict[str, str], *args: str, **kw: Any) -> Any:
    return subprocess.Popen(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        **kw,
    )


def test_erase_killed_midway_finishes_when_run_again(tmp_path: Path, postgres_url: str) -> None:
    """SIGKILL in the middle of the Kv tables (PostgreSQL Kv and journal), then a rerun: nothing left."""
    gone, kept = unique_id("gone"), unique_id("kept")
    journal_url = journals.with_namespace(postgres_url)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("BOTMESH_", "DATABASE_URL"))},
        "BOTMESH_DATA_DIR": str(tmp_path),
        "BOTMESH_KV_URL": postgres_url,
        "BOTMESH_JOURNAL_URL": journal_url,
        "BOTMESH_FIXTURES": os.environ.get("BOTMESH_FIXTURES", ""),
        "PYTHONUNBUFFERED": "1",
    }
    kv, journal = connect(postgres_url), connect_journal(journal_url)
    try:
        setup = (
            "from django.core.management import call_command as run; run('migrate', verbosity=0);"
            f"run('botmesh_tenant', 'create', '{gone}'); run('botmesh_tenant', 'create', '{kept}')"
        )
        proc = _manage(env, "shell", "-c", setup)  # one start-up: each costs seconds on a busy machine
        assert proc.wait(timeout=180) == 0, proc.stdout.read() if proc.stdout else ""
        tables = {t: seed_kv(kv, t, campaign_tables=400 if t == gone else 1) for t in (gone, kept)}
        for tenant in (gone, kept):
            seed_journal(journal, tenant, records=30)
        before = snapshot_raw(kv, journal, kept, tables[kept])

        first = _manage(env, "botmesh_tenant", "erase", gone, "--yes")
        assert first.stdout is not None
        dropped = 0
        for line in first.stdout:
            dropped += "kv: dropped" in line
            if dropped == 20:
                first.send_signal(signal.SIGKILL)
                break
        first.wait(timeout=60)
        assert first.returncode == -signal.SIGKILL
        left = [t for t in tables[gone] if kv.scan(t, limit=1)]
        assert 0 < len(left) < len(tables[gone])  # it really stopped midway

        second = _manage(env, "botmesh_tenant", "erase", gone, "--yes")
        output = second.communicate(timeout=120)[0]
        assert second.returncode == 0, output
        assert f"tenant {gone} erased" in output
        assert [t for t in tables[gone] if kv.scan(t, limit=1)] == []
        assert journal.list(tenant=gone, limit=10) == [] and journal.counts(gone) == {}
        assert kv.scan("campaigns/~system/index", prefix=f"{gone}!", limit=10) == []
        assert snapshot_raw(kv, journal, kept, tables[kept]) == before
    finally:
        KvCampaignStore(kv).index_erase(kept)
        for table in [
            t
            for package in ("campaigns", "crm", "inbox", "hub", "deployments", "observability")
            for t in kv.tables(f"{package}/{kept}/")
        ]:  # type: ignore[attr-defined]
            kv.drop(table)
        kv.close()
        journal.close()
        journals.drop(journal_url)


def snapshot_raw(kv: DurableKv, journal: EventJournal, tenant: str, tables: list[str]) -> dict[str, Any]:
    """``snapshot`` without the Django rows (the subprocess's own database)."""
    return {
        "journal": sorted(r.idempotency_key for r in journal.list(tenant=tenant, limit=200)),
        "entries": {t: [(e.key, e.value) for e in kv.scan(t, limit=100)] for t in tables},
        "due-index": [e.key for e in kv.scan("campaigns/~system/index", prefix=f"{tenant}!", limit=100)],
    }


@pytest.mark.django_db
def test_admin_page_erases_after_the_id_is_typed() -> None:
    gone = unique_id("gone")
    seed_rows(gone)
    admin, agent = Client(), Client()
    admin.login(username=f"u-{gone}", password="pw-123456789")
    get_user_model().objects.create_user("agent-2", password="pw-123456789")
    services.membership_set(gone, username="agent-2", role="agent")
    agent.login(username="agent-2", password="pw-123456789")
    url = f"/t/{gone}/settings/erase/"
    assert f'href="{url}"' in admin.get(f"/t/{gone}/settings/tokens/").content.decode()
    assert agent.get(url).status_code == 403
    page = admin.get(url).content.decode()
    assert f"Type <code>{gone}</code> to confirm" in page
    wrong = admin.post(url, {"confirm": gone.upper()})
    assert wrong.status_code == 422 and f"Type the tenant id exactly ({gone}) to erase it." in wrong.content.decode()
    assert Tenant.objects.filter(id=gone).exists()
    done = admin.post(url, {"confirm": gone})
    assert done.status_code == 200 and f"Tenant {gone} erased" in done.content.decode()
    assert not Tenant.objects.filter(id=gone).exists()
    assert admin.get(f"/t/{gone}/").status_code == 404
    from botmesh_admin.kv.runtime import default_kv

    time.sleep(0.5)  # the request's own trace is written once it ends
    assert default_kv().tables(f"observability/{gone}/") == []  # type: ignore[attr-defined]
