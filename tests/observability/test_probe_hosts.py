"""The probes answer whatever the ``Host`` header says (compose's healthcheck asks ``127.0.0.1:8000``).

Before: with the production profile's ``ALLOWED_HOSTS=admin.example.com`` every probe by IP was Django's
HTML "Bad Request (400)", so compose's healthcheck never passed; other paths keep the host check, in words.
"""

from __future__ import annotations

import pytest
from django.test import Client, override_settings

PRODUCTION_HOSTS = ["admin.example.com"]


@pytest.mark.django_db
@pytest.mark.parametrize("debug", [False, True])
def test_probes_answer_by_ip_while_other_paths_keep_the_host_check_in_words(debug: bool) -> None:
    by_ip = Client(HTTP_HOST="127.0.0.1:8000")
    with override_settings(ALLOWED_HOSTS=PRODUCTION_HOSTS, DEBUG=debug, BOTMESH_METRICS_TOKEN=None):
        healthz = by_ip.get("/healthz")
        assert (healthz.status_code, healthz.json()) == (200, {"status": "alive"})
        readyz = by_ip.get("/readyz")
        assert readyz.status_code in (200, 503) and "status" in readyz.json(), readyz.content
        metrics = by_ip.get("/metrics")
        assert metrics.status_code == 200 and b"botmesh_admin_" in metrics.content, metrics.content[:200]
        assert by_ip.post("/metrics").status_code == 405  # the view's own rules still apply (GET only)

        page = by_ip.get("/login/")
        html = page.content.decode()
        assert page.status_code == 400 and "This server does not answer to that name." in html
        assert "ALLOWED_HOSTS" in html and "DisallowedHost" not in html and "Traceback" not in html
        api = by_ip.get("/api/v1/tenants/tienda/whoami")
        assert api.status_code == 400 and api.json()["field"] == "Host"

        named = Client(HTTP_HOST="admin.example.com")
        assert named.get("/login/").status_code == 200


@pytest.mark.django_db
def test_metrics_keeps_its_bearer_token_on_any_host() -> None:
    by_ip = Client(HTTP_HOST="10.0.0.7:8000")
    with override_settings(ALLOWED_HOSTS=PRODUCTION_HOSTS, BOTMESH_METRICS_TOKEN="scrape-secret"):
        assert by_ip.get("/metrics").status_code == 401
        scraped = by_ip.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-secret")
        assert scraped.status_code == 200 and b"botmesh_admin_" in scraped.content
