"""The gate decision form of the bot page refuses in its own words and status (422 / 409), never a 200 redirect."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from botmesh_admin.tenancy import services as tenancy
from deployments import selectors, services

pytestmark = pytest.mark.django_db


@pytest.fixture
def waiting(tenant_id: str, versions) -> tuple[Client, str, str]:
    """An admin's client, the decision address of the release candidate's manual gate and the page's."""
    user = get_user_model().objects.create_user(f"adm-{tenant_id}", password="ops-password-1")
    tenancy.tenant_create(tenant_id, name="Ops Shop")
    tenancy.membership_set(tenant_id, username=user.username, role="admin")
    rc = versions[-1]["version"]
    services.version_publish(tenant_id, spec=versions[-1], actor="token:ci")
    client = Client()
    client.force_login(user)
    page = f"/t/{tenant_id}/deployments/tienda-bot/"
    return client, f"{page}versions/{rc}/gates/manual-approval/decision", rc


def test_a_gate_decision_with_an_empty_reason_is_422_under_the_reason(waiting, tenant_id: str) -> None:
    client, url, rc = waiting
    response = client.post(url, {"decision": "approve", "reason": "   "})
    assert response.status_code == 422
    html = response.content.decode()
    assert 'id="gate-reason-error"' in html and "Say why: the reason goes into the audit log." in html
    assert "validation_error" not in html
    assert selectors.version_get(tenant_id, "tienda-bot", rc).gate("manual-approval").status == "pending"


def test_the_losing_half_of_two_gate_decisions_is_409_and_says_so(waiting, tenant_id: str) -> None:
    client, url, rc = waiting
    # The other admin's decision lands first; this page still showed the buttons.
    services.gate_decide(tenant_id, "tienda-bot", rc, "manual-approval", decision="reject", reason="no", actor="x")
    response = client.post(url, {"decision": "approve", "reason": "QA signed off"})
    assert response.status_code == 409
    html = response.content.decode()
    assert 'data-testid="form-error"' in html and "manual-approval" in html
    assert selectors.version_get(tenant_id, "tienda-bot", rc).gate("manual-approval").status == "failed"
