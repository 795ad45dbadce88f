"""URL map. Tenant pages live under ``/t/<tenant>/<package>/``; each app owns its ``urls.py``."""

from __future__ import annotations

import importlib

from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect
from django.templatetags.static import static
from django.urls import include, path

from botmesh_admin.api import api
from botmesh_admin.observability import health
from botmesh_admin.tenancy import views as tenancy_views
from botmesh_admin.tenancy.decorators import page_missing

# (module, URL prefix inside /t/<tenant>/) — a module that does not exist yet is skipped.
TENANT_APPS = [
    ("botmesh_admin.tenancy.urls", "settings/"),
    ("botmesh_admin.channels.views", "channels/"),
    ("botmesh_admin.dashboard.urls", ""),
    ("botmesh_admin.events.urls", "journal/"),
    ("inbox.urls", "inbox/"),
    ("crm.urls", "crm/"),
    ("campaigns.urls", "campaigns/"),
    ("hub.urls", "plugins/"),
    ("deployments.urls", "deployments/"),
]
# (module, URL prefix at the root) for pages outside a tenant: webhooks, /metrics.
ROOT_APPS = [
    ("botmesh_admin.channels.urls", "webhooks/"),
    ("botmesh_admin.observability.urls", ""),
]


def _optional(module_name: str) -> object | None:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return None
        raise


# JSON on /api/ and /webhooks/, Django's pages elsewhere (botmesh_admin.httperrors).
handler400 = "botmesh_admin.httperrors.bad_request"
handler404 = "botmesh_admin.httperrors.page_not_found"
handler500 = "botmesh_admin.httperrors.server_error"


def favicon(request: HttpRequest) -> HttpResponse:
    """``/favicon.ico`` (what a browser asks for where a page names no icon): the static icon (301)."""
    return HttpResponsePermanentRedirect(static("botmesh/favicon.ico"))


urlpatterns = [
    path("favicon.ico", favicon, name="favicon"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("api/v1/", api.urls),
    path("login/", tenancy_views.LoginView.as_view(), name="login"),
    path("logout/", tenancy_views.auth_views.LogoutView.as_view(), name="logout"),
    path("", tenancy_views.home, name="home"),
    path("switch", tenancy_views.switch_tenant, name="switch-tenant"),
    path("t/<str:tenant>/", tenancy_views.tenant_home, name="tenant-home"),
]

for _module, _prefix in TENANT_APPS:
    if _optional(_module) is not None:
        urlpatterns.append(path(f"t/<str:tenant>/{_prefix}", include(_module)))
for _module, _prefix in ROOT_APPS:
    if _optional(_module) is not None:
        urlpatterns.append(path(_prefix, include(_module)))
# Last: any other address under a tenant is the app's 404 page, DEBUG or not.
urlpatterns.append(path("t/<str:tenant>/<path:rest>", page_missing, name="page-missing"))
