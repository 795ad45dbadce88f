"""Demo data for the campaigns package, through the running server's real API.

After the CRM demo (contacts and segments): a draft WhatsApp campaign to the
segment "VIP con consentimiento WhatsApp", and a small campaign to three listed
VIP contacts that is started and runs to completion. The demo configures no
WhatsApp access token, so in development it is sent by the console provider
(nothing leaves the machine). Loading twice adds nothing.
"""

from __future__ import annotations

import time
from typing import Any

SEGMENT = "VIP con consentimiento WhatsApp"
DRAFT = "Black Friday VIP"
SMALL = "Aviso de envío gratis (prueba)"
CHANNEL = "main"  # the demo's first WhatsApp number (inbox.demo); every campaign names its sending channel
MESSAGE = {"template": "promo_black_friday", "language": "es", "parameters": ["{name}", "30%"]}


def load(ctx: Any, tenant: str = "tienda", timeout_s: float = 60.0) -> str:
    """Create the demo campaigns; return a one-line summary."""
    base = f"/api/v1/tenants/{tenant}"
    _, segments = ctx.request("GET", f"{base}/segments", tenant=tenant)
    items = segments.get("items", []) if isinstance(segments, dict) else segments or []
    segment = next((s for s in items if s.get("name") == SEGMENT), None)
    if segment is None:
        return f"campaigns: no segment {SEGMENT!r} (the CRM demo did not run)"
    _, existing = ctx.request("GET", f"{base}/campaigns?limit=200", tenant=tenant)
    names = {c["name"] for c in (existing or {}).get("items", [])} if isinstance(existing, dict) else set()
    if DRAFT not in names:
        status, draft = ctx.request(
            "POST",
            f"{base}/campaigns",
            {
                "name": DRAFT,
                "segment_id": segment["id"],
                "channel": "whatsapp",
                "channel_name": CHANNEL,
                "message": MESSAGE,
            },
            tenant=tenant,
        )
        if status != 201:
            return f"campaigns: creating the draft failed ({status}: {draft})"
    _, preview = ctx.request(
        "POST", f"{base}/campaigns/plan", {"segment_id": segment["id"], "channel": "whatsapp"}, tenant=tenant
    )
    if SMALL in names:
        return f"campaigns: demo campaigns already loaded; the draft would reach {preview.get('recipients')} now"
    _, vips = ctx.request("GET", f"{base}/contacts?tag=vip&limit=50", tenant=tenant)
    listed = [
        c["id"]
        for c in (vips or {}).get("items", [])
        if c.get("consent", {}).get("whatsapp", {}).get("status") == "granted"
    ][:3]
    status, small = ctx.request(
        "POST",
        f"{base}/campaigns",
        {
            "name": SMALL,
            "segment_id": segment["id"],
            "channel": "whatsapp",
            "channel_name": CHANNEL,
            "contact_ids": listed,
            "message": {"template": "envio_gratis", "language": "es", "parameters": ["{name}"]},
        },
        tenant=tenant,
    )
    if status != 201:
        return f"campaigns: creating the small campaign failed ({status}: {small})"
    ctx.request("POST", f"{base}/campaigns/{small['id']}/start", tenant=tenant)
    deadline = time.monotonic() + timeout_s
    state = small
    while state.get("state") not in ("completed", "failed", "cancelled") and time.monotonic() < deadline:
        time.sleep(0.5)
        _, state = ctx.request("GET", f"{base}/campaigns/{small['id']}", tenant=tenant)
    progress = (state.get("progress") or {}).get("states", {})
    left_out = ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in (preview.get("dropped") or {}).items())
    outcomes = ", ".join(f"{n} {outcome.replace('_', ' ')}" for outcome, n in progress.items())
    return (
        f"campaigns: draft {DRAFT!r} would reach {preview.get('recipients')} "
        f"(left out: {left_out or 'none'}); {SMALL!r} is {state.get('state')} ({outcomes or 'no deliveries'})"
    )
