"""The demo installation: users, tenants and data loaded from ``shared/fixtures``.

Data goes in through the real ingestion path: ``load_over_http`` POSTs the
fixtures to the running web server's webhook, ledger and API endpoints, exactly
as Meta, Telegram, a bot or a CI pipeline would. Each package contributes a
loader to ``LOADERS`` (module path of a function ``load(ctx) -> str``).
"""

from __future__ import annotations

import importlib
import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEMO_TENANT = "tienda"
DEMO_BOT = "tienda-bot"
"""The demo tenant's bot: its metrics are in the demo, and ``./dev run`` starts it as replica processes."""
DEMO_TENANTS = {"tienda": ("Tienda Demo", "CO"), "soporte": ("Soporte Demo", "CO")}
ADMIN_USER, ADMIN_PASSWORD = "admin", "botmesh-demo"
AGENT_USER, AGENT_PASSWORD = "agent", "botmesh-agent"

# Each entry: "module:function". A module that does not exist yet is skipped.
LOADERS = [
    "botmesh_admin.events.demo:load",  # first: its retries run while the others load
    "crm.demo:load",
    "inbox.demo:load",
    "hub.demo:load",
    "deployments.demo:load",
    "campaigns.demo:load",
    "botmesh_admin.observability.demo:load",
    "botmesh_admin.events.demo:settle",  # last: waits for the demo fault to be a dead letter
]


def fixtures_dir() -> Path:
    """Return the shared fixtures folder (``BOTMESH_FIXTURES`` or ``../shared/fixtures``)."""
    explicit = os.environ.get("BOTMESH_FIXTURES")
    if explicit:
        return Path(explicit)
    here = Path(__file__).resolve().parent.parent
    for candidate in (here.parent / "shared" / "fixtures", here / "shared" / "fixtures"):
        if candidate.is_dir():
            return candidate
    return here.parent / "shared" / "fixtures"


@dataclass
class DemoContext:
    """What a loader needs: the base URL, an admin token per tenant, the fixtures folder."""

    base_url: str
    tokens: dict[str, str]
    fixtures: Path
    notes: list[str] = field(default_factory=list)

    def request(
        self,
        method: str,
        path: str,
        body: bytes | dict[str, Any] | list[Any] | None = None,
        headers: dict[str, str] | None = None,
        tenant: str | None = DEMO_TENANT,
    ) -> tuple[int, Any]:
        """Send one HTTP request to the running server; return ``(status, parsed JSON or text)``."""
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        hdrs = {"Content-Type": "application/json"}
        if tenant is not None:
            hdrs["Authorization"] = f"Bearer {self.tokens[tenant]}"
        hdrs.update(headers or {})
        req = urllib.request.Request(self.base_url + path, data=data, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                raw, status = resp.read(), resp.status
        except urllib.error.HTTPError as exc:
            raw, status = exc.read(), exc.code
        try:
            return status, json.loads(raw or b"null")
        except ValueError:
            return status, raw.decode(errors="replace")


def ensure_accounts() -> dict[str, str]:
    """Create the demo users, tenants and one admin API token per tenant; return the tokens."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from botmesh_admin.tenancy import services
    from botmesh_admin.tenancy.models import ApiToken

    users = get_user_model()
    for username, password in ((ADMIN_USER, ADMIN_PASSWORD), (AGENT_USER, AGENT_PASSWORD)):
        user = users.objects.filter(username=username).first() or users(username=username)
        user.set_password(password)
        user.save()
    tokens: dict[str, str] = {}
    for tenant, (name, region) in DEMO_TENANTS.items():
        services.tenant_create(tenant, name=name, default_region=region)
        services.membership_set(tenant, username=ADMIN_USER, role="admin")
        services.membership_set(tenant, username=AGENT_USER, role="agent")
        ApiToken.objects.filter(tenant_id=tenant, name="demo-loader", revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        _, tokens[tenant] = services.token_create(tenant, name="demo-loader", role="admin", created_by="demo")
    return tokens


MARKER_TABLE, MARKER_KEY = "system/demo", "loaded"


def demo_loaded() -> dict[str, Any] | None:
    """Return the record of an earlier demo load (``{"at": ms, "summaries": [...]}``), or ``None``."""
    from botmesh_admin.kv.runtime import default_kv

    entry = default_kv().get(MARKER_TABLE, MARKER_KEY)
    return entry.value if entry else None


def mark_demo_loaded(summaries: list[str]) -> None:
    """Remember that the demo data is in, so the next start does not load it over the user's edits."""
    from botmesh_admin.clock import now_ms
    from botmesh_admin.kv import Put
    from botmesh_admin.kv.runtime import default_kv

    default_kv().commit(MARKER_TABLE, [Put(MARKER_KEY, {"at": now_ms(), "summaries": summaries})])


def load_over_http(base_url: str, tokens: dict[str, str]) -> list[str]:
    """Run every package's demo loader against the server at ``base_url``; return their summaries."""
    ctx = DemoContext(base_url=base_url.rstrip("/"), tokens=tokens, fixtures=fixtures_dir())
    summaries: list[str] = []
    for spec in LOADERS:
        module_name, func_name = spec.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue
            raise
        summaries.append(getattr(module, func_name)(ctx))
    return summaries
