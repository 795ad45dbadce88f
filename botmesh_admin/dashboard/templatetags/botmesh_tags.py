"""Template filters shared by the admin pages (`{% load botmesh_tags %}`)."""

from __future__ import annotations

from django import template

from botmesh_admin.timefmt import when

register = template.Library()


@register.filter
def ms_datetime(value: int | None) -> str:
    """Alias of the builtin ``when`` (``botmesh_admin.timefmt``), the one time format of the pages."""
    return when(value)


@register.filter
def status_pill(status: str) -> str:
    """Return the pill class of a status: ok, warn or bad."""
    return {
        "enabled": "ok",
        "succeeded": "ok",
        "passed": "ok",
        "active": "ok",
        "pending-approval": "warn",
        "running": "warn",
        "inconclusive": "warn",
        "pending": "",
        "incompatible": "bad",
        "failed": "bad",
        "error": "bad",
    }.get(status, "")


@register.filter
def detail_value(value: object) -> str:
    """Render an audit detail value: lists joined by commas, the rest as text."""
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    return str(value)
