"""Template context: the navigation of every package and the tenant switcher.

Each AppConfig may declare ``nav = [(label, url_name, role), …]``; url names
take the ``tenant`` kwarg. Entries whose URL does not resolve yet are left out.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse

from .selectors import tenant_list_for_user


def navigation(request: HttpRequest) -> dict[str, Any]:
    """Return ``nav`` (links of the current tenant) and ``tenants`` (for the switcher)."""
    match = getattr(request, "resolver_match", None)
    tenant = match.kwargs.get("tenant") if match else None
    principal = getattr(request, "principal", None)
    items = []
    if tenant and principal is not None:
        for config in apps.get_app_configs():
            for label, url_name, role in getattr(config, "nav", []):
                if not principal.can(role):
                    continue
                try:
                    url = reverse(url_name, kwargs={"tenant": tenant})
                except NoReverseMatch:
                    continue
                items.append({"label": label, "url": url, "active": request.path.startswith(url)})
    items.sort(key=lambda i: NAV_ORDER.get(i["label"], 99))
    return {
        "nav": items,
        "current_tenant": tenant,
        "tenants": tenant_list_for_user(request.user) if hasattr(request, "user") else [],
    }


NAV_ORDER = {
    "Overview": 0,
    "Inbox": 1,
    "Contacts": 2,
    "Segments": 3,
    "Campaigns": 4,
    "Plugins": 5,
    "Deployments": 6,
    "Journal": 7,
    "Replicas": 8,
    "Jobs": 9,
    "Metrics": 10,
    "Traces": 11,
    "Settings": 20,
}
