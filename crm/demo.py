"""Demo data for the crm package: the fixture CSV uploaded through the real import endpoint."""

from __future__ import annotations

import time
from typing import Any

DEMO_SEGMENTS = [
    ("VIP con consentimiento WhatsApp", {"tags_all": ["vip"], "consent_required": "whatsapp"}),
    ("Plan pro", {"attributes": {"plan": "pro"}}),
    ("Morosos sin VIP", {"tags_all": ["moroso"], "tags_none": ["vip"]}),
]


def load(ctx: Any, tenant: str = "tienda", timeout_s: float = 90.0) -> str:
    """Upload ``crm/contacts.csv``, wait for the import task, save demo segments; return a summary."""
    base = f"/api/v1/tenants/{tenant}"
    body = (ctx.fixtures / "crm" / "contacts.csv").read_bytes()
    status, job = ctx.request(
        "POST",
        f"{base}/contacts/imports",
        body,
        {"Content-Type": "text/csv", "X-Filename": "contacts.csv"},
        tenant=tenant,
    )
    if status != 202:
        return f"crm: import refused ({status}: {job})"
    deadline = time.monotonic() + timeout_s
    while job.get("status") not in ("done", "failed") and time.monotonic() < deadline:
        time.sleep(0.5)
        _, job = ctx.request("GET", f"{base}/contacts/imports/{job['id']}", tenant=tenant)
    _, existing = ctx.request("GET", f"{base}/segments", tenant=tenant)
    names = {s["name"] for s in existing} if isinstance(existing, list) else set()
    for name, rules in DEMO_SEGMENTS:
        if name not in names:
            ctx.request("POST", f"{base}/segments", {"name": name, "rules": rules}, tenant=tenant)
    if job.get("status") != "done":
        return (
            f"crm: import {job.get('id')} is {job.get('status')} ({job.get('processed')}/{job.get('total_rows')} rows)"
        )
    return (
        f"crm: imported {job['filename']}: {job['created']} contacts created, {job['merged']} merged, "
        f"{job['failed_rows']} bad row(s) reported; {len(DEMO_SEGMENTS)} segments"
    )
