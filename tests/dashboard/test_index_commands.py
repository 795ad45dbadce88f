"""``manage.py botmesh_reindex`` and ``botmesh_check_indexes`` over a declared collection.

The collection is a test one (the tickets of ``tests/kv/index_workers.py``),
declared for the test and removed after it, so the commands are proven on
records written before their indexes existed, exactly as an upgraded
installation has them.
"""

from __future__ import annotations

import io
import random

import pytest
from django.core.management import CommandError, call_command

from botmesh_admin.dashboard.apps import tell_about_unbuilt_indexes
from botmesh_admin.kv import Put, TenantKv
from botmesh_admin.kv import indexes as kv_indexes
from botmesh_admin.kv.runtime import default_kv
from tests.kv.index_workers import TICKET, random_ticket

pytestmark = pytest.mark.django_db


@pytest.fixture
def legacy_table(tenant_id: str):
    """A tenant whose ``testpkg/tickets`` table holds 150 tickets written without any index."""
    from botmesh_admin.tenancy.models import Tenant

    Tenant.objects.create(id=tenant_id, name="Legacy")
    kv_indexes.declare("testpkg", "tickets", [TICKET])
    table = TenantKv(default_kv(), "testpkg").table(tenant_id, "tickets")
    rng = random.Random(2)
    for i in range(150):
        default_kv().commit(table, [Put(f"t/{i:04d}", random_ticket(rng))])
    yield table
    kv_indexes._declared.pop(("testpkg", "tickets"), None)


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_migrate_names_the_command_while_an_index_is_not_built(legacy_table, capsys) -> None:
    """An upgraded installation is told the one command to run."""
    from django.apps import apps

    tell_about_unbuilt_indexes(apps.get_app_config("dashboard"))
    assert "run `python manage.py botmesh_reindex`" in capsys.readouterr().out


def test_reindex_builds_every_index_with_progress_and_check_finds_no_drift(legacy_table, tenant_id) -> None:
    """The build walks the existing records; afterwards the check agrees with them."""
    out = run("botmesh_reindex", "--tenant", tenant_id, "--batch", "40")
    assert f"{tenant_id} testpkg/tickets n_status: 150 records indexed, built" in out
    assert "150 records" in out
    layout = kv_indexes.IndexedTable(default_kv(), (TICKET,))
    assert {layout.state(legacy_table, i.name) for i in TICKET.indexes} == {"built"}
    report = run("botmesh_check_indexes", "--tenant", tenant_id)
    assert "checked, 0 drifting" in report and "drift (" not in report
    again = run("botmesh_reindex", "--tenant", tenant_id)
    assert "0 index(es) built" in again  # nothing left to do


def test_check_reports_drift_and_repair_rebuilds(legacy_table, tenant_id) -> None:
    """A counter changed by hand is reported (exit status 1); --repair puts it right."""
    run("botmesh_reindex", "--tenant", tenant_id)
    counter = default_kv().scan(legacy_table, prefix="x/n_status/", limit=1)[0]
    default_kv().commit(legacy_table, [Put(counter.key, counter.value + 7)])
    with pytest.raises(CommandError, match="1 index\\(es\\) drift"):
        run("botmesh_check_indexes", "--tenant", tenant_id, "--index", "n_status")
    out = run("botmesh_check_indexes", "--tenant", tenant_id, "--index", "n_status", "--repair")
    assert "n_status: drift (1 wrong); rebuilt" in out
    assert "0 drifting" in run("botmesh_check_indexes", "--tenant", tenant_id)


def test_unknown_tenant_or_index_is_named(legacy_table) -> None:
    """Bad options get one line naming the option."""
    with pytest.raises(CommandError, match="--tenant: no tenant 'nope'"):
        run("botmesh_reindex", "--tenant", "nope")
    with pytest.raises(CommandError, match="--index: no index 'nope'"):
        run("botmesh_check_indexes", "--index", "nope")


@pytest.fixture
def legacy_family(tenant_id: str):
    """A tenant with two ``testpkg/tk-*`` tables (one per parent record), 30 tickets each, no index."""
    from botmesh_admin.tenancy.models import Tenant

    Tenant.objects.create(id=tenant_id, name="Legacy family")
    kv_indexes.declare("testpkg", "tk", [TICKET], instances=lambda kv, tenant: ["tk-a", "tk-b"])
    rng = random.Random(3)
    tables = [TenantKv(default_kv(), "testpkg").table(tenant_id, name) for name in ("tk-a", "tk-b")]
    for table in tables:
        for i in range(30):
            default_kv().commit(table, [Put(f"t/{i:04d}", random_ticket(rng))])
    yield tables
    kv_indexes._declared.pop(("testpkg", "tk"), None)


def test_a_declaration_with_instances_is_built_and_checked_in_each_table(legacy_family, tenant_id) -> None:
    """One table per parent record (a campaign's deliveries): every instance the declaration lists is walked."""
    out = run("botmesh_reindex", "--tenant", tenant_id, "--index", "n_status")
    assert f"{tenant_id} testpkg/tk-a n_status: 30 records indexed, built" in out
    assert f"{tenant_id} testpkg/tk-b n_status: 30 records indexed, built" in out
    assert "2 index(es) built" in out
    assert "2 checked, 0 drifting" in run("botmesh_check_indexes", "--tenant", tenant_id, "--index", "n_status")
