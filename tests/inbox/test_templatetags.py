"""Template filters of the inbox pages."""

from __future__ import annotations

import datetime as dt

from django.utils import timezone

from inbox.templatetags.inbox_tags import ms_iso, ms_time


def _ms(*parts: int) -> int:
    return int(dt.datetime(*parts, tzinfo=dt.UTC).timestamp() * 1000)


def test_message_time_always_shows_the_date_with_its_year() -> None:
    """Found by exploratory testing: on 30 Nov 2026 a message of 30 Nov 2025 read "30 Nov 15:26".

    Times are now the pages' one format (``botmesh_admin.timefmt``), date and year included.
    """
    with timezone.override("UTC"):
        assert ">2025-11-30 15:26:00 UTC</time>" in ms_time(_ms(2025, 11, 30, 15, 26))
    assert ms_iso(_ms(2025, 11, 30, 15, 26)) == "2025-11-30T15:26:00Z"
