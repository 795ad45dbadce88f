"""The crm demo loader against a live server (the real HTTP import endpoint)."""

from __future__ import annotations

import pytest

from botmesh_admin.celery import app as celery_app
from botmesh_admin.demo import DemoContext, fixtures_dir
from botmesh_admin.tenancy import services as tenancy
from crm import demo, selectors


@pytest.mark.django_db(transaction=True)
def test_demo_loader_imports_the_fixture_over_http(live_server, tenant_id: str) -> None:
    import faulthandler, sys; faulthandler.dump_traceback_later(30, exit=False, file=sys.stderr)
    tenancy.tenant_create(tenant_id, name="Tienda")
    _, token = tenancy.token_create(tenant_id, name="demo", role="admin")
    ctx = DemoContext(base_url=live_server.url, tokens={tenant_id: token}, fixtures=fixtures_dir())
    previous = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    try:
        summary = demo.load(ctx, tenant=tenant_id)
    finally:
        celery_app.conf.task_always_eager = previous
    assert summary == (
        "crm: imported contacts.csv: 201 contacts created, 1 merged, 1 bad row(s) reported; "
        "3 segments"
    )
    assert len(selectors.segment_list(tenant_id)) == 3
    demo.load(ctx, tenant=tenant_id)
    assert len(selectors.segment_list(tenant_id)) == 3, "loading twice adds no segment twice"
