"""The crm demo loader against a live server (the real HTTP import endpoint)."""

from __future__ import annotations

import pytest

from botmesh_admin.celery import app as celery_app
from botmesh_admin.demo import DemoContext, fixtures_dir
from botmesh_admin.tenancy import services as tenancy
from crm import demo, selectors


@pytest.fixture
def eager_celery():
    previous = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = previous


@pytest.mark.django_db(transaction=True)
def test_demo_loader_imports_the_fixture_over_http(live_server, tenant_id: str, eager_celery) -> None:
    tenancy.tenant_create(tenant_id, name="Tienda")
    _, token = tenancy.token_create(tenant_id, name="demo", role="admin")
    ctx = DemoContext(base_url=live_server.url, tokens={tenant_id: token}, fixtures=fixtures_dir())
    summary = demo.load(ctx, tenant=tenant_id)
    assert summary == ("crm: imported contacts.csv: 201 contacts created, 1 merged, 1 bad row(s) reported; 3 segments")
    assert len(selectors.segment_list(tenant_id)) == 3
    again = demo.load(ctx, tenant=tenant_id)
    assert again.startswith("crm: imported contacts.csv: 0 contacts created, 202 merged")
    assert len(selectors.segment_list(tenant_id)) == 3, "loading twice adds no segment twice"
