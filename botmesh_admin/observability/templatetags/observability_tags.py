"""Template filters for epoch-millisecond times and durations."""

from __future__ import annotations

from django import template

from botmesh_admin.timefmt import when

register = template.Library()


@register.filter
def ms_time(value: float | int | None) -> str:
    """Alias of the builtin ``when`` (``botmesh_admin.timefmt``), the one time format of the pages."""
    return when(value)


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
