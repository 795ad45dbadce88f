"""Template filters shared by the admin pages (`{% load botmesh_tags %}`)."""

from __future__ import annotations

from datetime import UTC, datetime

from django import template

register = template.Library()


@register.filter
def ms_datetime(value: int | None) -> str:
    """Render epoch milliseconds as ``YYYY-MM-DD HH:MM:SS UTC`` (empty for ``None``)."""
    if value is None or value == "":
        return ""
    return datetime.fromtimestamp(int(value) / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


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
