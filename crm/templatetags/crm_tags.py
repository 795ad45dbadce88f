"""Template filters of the CRM pages."""

from __future__ import annotations

import json

from django import template

from botmesh_admin.timefmt import when

register = template.Library()


@register.filter
def ms_datetime(value: int | None) -> str:
    """Alias of the builtin ``when`` (``botmesh_admin.timefmt``), the one time format of the pages."""
    return when(value)


@register.filter
def consent_class(status: str | None) -> str:
    """Return the pill class of a consent status."""
    return {"granted": "ok", "denied": "bad"}.get(status or "", "")


@register.filter
def json_literal(value: object) -> str:
    """Show an attribute value as JSON, so "1" (text) and 1 (number) look different."""
    return json.dumps(value, ensure_ascii=False)
