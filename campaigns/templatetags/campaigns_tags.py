"""Template helpers of the campaign pages."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django import template

from botmesh_admin.timefmt import when
from campaigns.domain import OUTCOMES, DeliveryCounts

register = template.Library()


@register.filter
def get_item(mapping: Mapping[str, Any] | None, key: str) -> Any:
    """Return ``mapping[key]`` (or nothing)."""
    return (mapping or {}).get(key, "")


@register.filter
def ms_utc(value: int | None) -> str:
    """Alias of the builtin ``when`` (``botmesh_admin.timefmt``), the one time format of the pages."""
    return when(value)


@register.filter
def split_reason(key: str) -> tuple[str, str]:
    """Split ``state:reason`` (the reason may hold colons: ``failed:code:131047``)."""
    state, _, reason = str(key).partition(":")
    return state, reason


@register.filter
def human(name: str) -> str:
    """``in_doubt`` → ``in doubt``."""
    return str(name).replace("_", " ")


@register.filter
def minus(value: int, other: int) -> int:
    """``value - other`` (counts: recipients less those the run will drop)."""
    return int(value) - int(other)


@register.filter
def outcome_counts(counts: DeliveryCounts | None) -> list[tuple[str, int]]:
    """Return ``[(outcome, n), …]`` of the outcomes with deliveries, in ``OUTCOMES`` order (a final result)."""
    if counts is None:
        return []
    return [(outcome, counts.get(outcome)) for outcome in OUTCOMES if counts.get(outcome)]
