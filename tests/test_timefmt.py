"""One time format on every page, in the tenant's time zone (issue 20 item 7)."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest
from django.template import Context, Template
from django.test import Client
from django.utils import timezone

from botmesh_admin.errors import ValidationError
from botmesh_admin.tenancy import services
from botmesh_admin.tenancy.models import Tenant
from botmesh_admin.timefmt import format_instant, when

# 2026-12-01 14:55:59 UTC
INSTANT_MS = int(dt.datetime(2026, 12, 1, 14, 55, 59, tzinfo=dt.UTC).timestamp() * 1000)
REPO = Path(__file__).resolve().parent.parent


def test_an_instant_is_shown_in_the_active_zone_with_the_zone() -> None:
    with timezone.override("America/Bogota"):
        assert format_instant(INSTANT_MS) == "2026-12-01 09:55:59 -05"
        html = str(when(INSTANT_MS))
    assert html == '<time datetime="2026-12-01T14:55:59Z" title="America/Bogota">2026-12-01 09:55:59 -05</time>'
    with timezone.override("UTC"):
        assert format_instant(INSTANT_MS) == "2026-12-01 14:55:59 UTC"
    with timezone.override("Europe/Madrid"):  # a datetime (Django models) reads the same
        assert format_instant(dt.datetime(2026, 7, 1, 10, 0, tzinfo=dt.UTC)) == "2026-07-01 12:00:00 CEST"
    assert format_instant(None) == "" and format_instant("") == "" and when(None) == ""


@pytest.mark.parametrize(
    "value",
    ["²", "١٢", "9" * 30, "12ab", 10**20, -(10**18), float("nan"), float("inf"), -62135596800000],
)
def test_an_instant_no_datetime_holds_shows_nothing_instead_of_failing_the_page(value: object) -> None:
    """Stored milliseconds out of datetime's range, or text that is no ASCII number, render as nothing."""
    with timezone.override("America/Bogota"):  # year 1, 00:00 UTC, is out of range at -05
        assert format_instant(value) == "" and when(value) == ""


def test_milliseconds_as_text_read_as_the_number() -> None:
    with timezone.override("UTC"):
        assert format_instant(str(INSTANT_MS)) == format_instant(INSTANT_MS) == "2026-12-01 14:55:59 UTC"


def test_every_template_uses_the_one_time_filter() -> None:
    """No template formats a time itself: ``|date``, ``|time`` and the old per-package filters are gone."""
    offenders = []
    for path in REPO.glob("*/**/templates/**/*.html"):
        if ".venv" in path.parts:
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if re.search(r"\|(date|time|ms_time|ms_utc|ms_datetime|ms_iso)\b", line):
                offenders.append(f"{path.relative_to(REPO)}:{number}")
    assert offenders == []


def test_the_filter_needs_no_load_tag() -> None:
    with timezone.override("America/Bogota"):
        assert (
            Template("{{ t|when }} {% current_zone %}")
            .render(Context({"t": INSTANT_MS}))
            .endswith("2026-12-01 09:55:59 -05</time> America/Bogota")
        )


@pytest.fixture
def bogota(db):  # type: ignore[no-untyped-def]
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_user("ana", password="ana-password-1")
    get_user_model().objects.create_user("leo", password="leo-password-1")
    services.tenant_create("bogota", name="Bogotá")
    services.membership_set("bogota", username="ana", role="admin")
    services.membership_set("bogota", username="leo", role="agent")
    return "bogota"


def _client(name: str) -> Client:
    client = Client()
    assert client.login(username=name, password=f"{name}-password-1")
    return client


def test_an_admin_sets_the_zone_and_every_page_shows_it(bogota) -> None:  # type: ignore[no-untyped-def]
    ana = _client("ana")
    page = ana.get("/t/bogota/").content.decode()
    assert 'data-testid="time-zone" title="Times on these pages are in this zone">UTC<' in page  # not chosen: UTC
    response = ana.post("/t/bogota/settings/time-zone", {"time_zone": "America/Bogota"})
    assert response.status_code == 302
    assert Tenant.objects.get(id="bogota").time_zone == "America/Bogota"
    settings_page = ana.get("/t/bogota/settings/tokens/").content.decode()
    assert "<option selected>America/Bogota</option>" in settings_page
    token = services.token_create("bogota", name="ci")[0]
    shown = format_instant(token.created_at).replace("UTC", "")  # the instant, read in UTC
    with timezone.override("America/Bogota"):
        local = format_instant(token.created_at)
    assert local.endswith(" -05") and local[:16] != shown[:16]
    assert local in ana.get("/t/bogota/settings/tokens/").content.decode()
    assert ">America/Bogota<" in _client("leo").get("/t/bogota/inbox/").content.decode()  # for every member


def test_a_bad_zone_is_refused_next_to_the_field(bogota) -> None:  # type: ignore[no-untyped-def]
    response = _client("ana").post("/t/bogota/settings/time-zone", {"time_zone": "Mars/Olympus"})
    html = response.content.decode()
    assert response.status_code == 422
    assert 'id="time-zone-time_zone-error" role="alert" data-testid="field-error">Is not a time zone name' in html
    assert "validation_error" not in html and "422" not in html
    assert Tenant.objects.get(id="bogota").time_zone == ""


def test_the_browser_zone_is_taken_only_while_none_is_chosen(bogota) -> None:  # type: ignore[no-untyped-def]
    ana = _client("ana")
    first = ana.post("/t/bogota/settings/time-zone", {"time_zone": "America/Bogota", "initial": "1"})
    assert first.status_code == 205  # changed: the page reloads to show it
    again = ana.post("/t/bogota/settings/time-zone", {"time_zone": "Europe/Madrid", "initial": "1"})
    assert again.status_code == 204 and Tenant.objects.get(id="bogota").time_zone == "America/Bogota"
    assert _client("leo").post("/t/bogota/settings/time-zone", {"time_zone": "UTC"}).status_code == 403


def test_the_service_names_the_field(bogota) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError) as caught:
        services.tenant_time_zone_set("bogota", time_zone="EST5EDT-nope")
    assert caught.value.field == "time_zone"
