"""One way to show an instant on every admin page: ``{{ value|when }}``.

Every page shows times in the tenant's time zone (``Tenant.time_zone``, set on
the Settings page; UTC until it is set), activated for the request by
``tenancy.decorators.tenant_page`` through Django's time-zone support
(``django.utils.timezone.activate`` with a ``zoneinfo.ZoneInfo``). The format is
the same everywhere — ``2026-12-01 09:55:59 -05`` (ISO 8601 date and time, then
the zone's abbreviation, ``UTC`` for UTC) — inside a ``<time>`` element whose
``datetime`` is the UTC instant and whose ``title`` names the zone
(``America/Bogota``).

The filter is a template builtin (``settings.TEMPLATES`` ``builtins``), so no
template loads it.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from functools import lru_cache

from django import template
from django.utils import timezone
from django.utils.html import format_html

from botmesh_admin.validation import ascii_digits

register = template.Library()

FORMAT = "%Y-%m-%d %H:%M:%S"
"""The one date-and-time format of the pages (the zone's abbreviation follows it)."""


@lru_cache(maxsize=1)
def zone_names() -> tuple[str, ...]:
    """Return the IANA time zone names this installation knows, sorted (``America/Bogota`` …)."""
    return tuple(sorted(n for n in zoneinfo.available_timezones() if "/" in n or n == "UTC"))


def zone_or_none(name: str | None) -> zoneinfo.ZoneInfo | None:
    """Return the zone named ``name``, or ``None`` for an empty or unknown name."""
    if not name or name not in zone_names():
        return None
    return zoneinfo.ZoneInfo(name)


def instant(value: object) -> dt.datetime | None:
    """Return ``value`` as an aware UTC datetime, or ``None`` for nothing.

    ``value`` is epoch milliseconds (``int``/``float``, the store's unit, or
    their ASCII digits as text), an aware ``datetime`` (Django models), or
    ``None`` / ``""``. Milliseconds no ``datetime`` can hold (NaN, infinite,
    outside years 1..9999, less a day at each end so that every
    time zone can show them) and any other text are ``None`` too: a page shows
    nothing for them rather than failing.
    """
    if value is None or value == "" or isinstance(value, bool):
        return None
    if isinstance(value, dt.datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
    if isinstance(value, str):
        if not ascii_digits(value.removeprefix("-")):
            return None
        value = int(value)
    if isinstance(value, int | float):
        try:
            at = dt.datetime.fromtimestamp(float(value) / 1000, tz=dt.UTC)
        except (OverflowError, OSError, ValueError):  # out of time_t or datetime's range, or NaN
            return None
        return at if _SHOWN_FROM <= at <= _SHOWN_UNTIL else None
    return None


# A day inside datetime's range at each end: the instant then fits in every time zone it is shown in.
_SHOWN_FROM = dt.datetime(1, 1, 2, tzinfo=dt.UTC)
_SHOWN_UNTIL = dt.datetime(9999, 12, 30, tzinfo=dt.UTC)


def zone_label(at: dt.datetime) -> str:
    """Return the zone abbreviation shown after a time: ``UTC``, ``-05``, ``CET``."""
    return at.tzname() or at.strftime("%z")


def format_instant(value: object) -> str:
    """Return ``value`` as the pages show it, in the active zone: ``2026-12-01 09:55:59 -05`` (``""`` for none)."""
    at = instant(value)
    if at is None:
        return ""
    local = timezone.localtime(at)
    return f"{local.strftime(FORMAT)} {zone_label(local)}"


@register.filter
def when(value: object) -> str:
    """Render an instant as ``<time datetime="…Z" title="America/Bogota">2026-12-01 09:55:59 -05</time>``.

    ``value``: epoch ms or an aware datetime; empty for ``None``.
    """
    at = instant(value)
    if at is None:
        return ""
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        timezone.get_current_timezone_name(),
        format_instant(at),
    )


@register.simple_tag
def current_zone() -> str:
    """Return the name of the zone the page shows times in (``America/Bogota``, ``UTC``)."""
    return timezone.get_current_timezone_name()
