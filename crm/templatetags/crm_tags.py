"""Template filters of the CRM pages."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from django import template

register = template.Library()


@register.filter
def ms_datetime(value: int | None) -> str:
    """Format epoch milliseconds as ``YYYY-MM-DD HH:MM`` UTC."""
    if not value:
        return ""
    return datetime.fromtimestamp(value / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")


@register.filter
def consent_class(status: str | None) -> str:
    """Return the pill class of a consent status."""
    return {"granted": "ok", "denied": "bad"}.get(status or "", "")


@register.filter
def json_literal(value: object) -> str:
    """Show an attribute value as JSON, so "1" (text) and 1 (number) look different."""
    return json.dumps(value, ensure_ascii=False)
