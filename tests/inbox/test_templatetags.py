"""Template filters of the inbox pages."""

from __future__ import annotations

import datetime as dt

from inbox.templatetags import inbox_tags
from inbox.templatetags.inbox_tags import ms_time


def _ms(*parts: int) -> int:
    return int(dt.datetime(*parts, tzinfo=dt.UTC).timestamp() * 1000)


def test_message_time_shows_the_year_only_when_it_is_not_this_year(monkeypatch, settings) -> None:  # type: ignore[no-untyped-def]
    """Found by exploratory testing: on 30 Nov 2026 a message of 30 Nov 2025 read "30 Nov 15:26"."""
    settings.TIME_ZONE = "UTC"
    now = dt.datetime(2026, 11, 30, 18, 0, tzinfo=dt.UTC)
    monkeypatch.setattr(inbox_tags.timezone, "localtime", lambda *args: now)
    assert ms_time(_ms(2025, 11, 30, 15, 26)) == "30 Nov 2025 15:26"
    assert ms_time(_ms(2027, 1, 2, 9, 5)) == "02 Jan 2027 09:05"
    assert ms_time(_ms(2026, 11, 29, 15, 26)) == "29 Nov 15:26"
    assert ms_time(_ms(2026, 11, 30, 15, 26)) == "15:26"
