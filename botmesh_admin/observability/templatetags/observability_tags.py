"""Template filters for epoch-millisecond times and durations."""

from __future__ import annotations

from datetime import UTC, datetime

from django import template

register = template.Library()


@register.filter
def ms_time(epoch_ms: float | int | None) -> str:
    """Format epoch ms as ``2025-05-01 12:00:00`` (UTC)."""
    if epoch_ms is None:
        return ""
    return datetime.fromtimestamp(float(epoch_ms) / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


@register.filter
def ms_duration(ms: float | int | None) -> str:
    """Format a duration in ms: ``850 µs``, ``12.5 ms``, ``3.20 s``."""
    if ms is None:
        return ""
    value = float(ms)
    if value == 0:
        return "0 ms"
    if value < 1:
        return f"{value * 1000:.0f} µs"
    if value < 1000:
        return f"{value:.1f} ms"
    return f"{value / 1000:.2f} s"
