"""Snapshots with the botmesh shape: camelCase in, snake_case out, field paths on errors."""

from __future__ import annotations

import pytest

from botmesh_admin.errors import ValidationError
from botmesh_admin.observability.domain import Snapshot, format_uptime

BOTMESH_JSON = {
    "startedAt": "2025-05-01T12:00:00.000Z",
    "uptimeMs": 273_600_000,
    "conversations": {
        "started": 10,
        "completed": 5,
        "ended": 1,
        "guarded": 1,
        "cancelled": 0,
        "timedOut": 1,
        "retriesExceeded": 0,
        "errored": 1,
        "avgDurationMs": 5400.5,
        "active": 1,
    },
    "flows": {"checkout": {"started": 4, "completed": 3, "avgDurationMs": 1200}},
    "messages": {"in": 120, "out": 100, "outFailed": 2},
    "dropped": {"duplicate": 3, "blocked": 1, "handoff": 4},
    "presenceSkipped": {"typing": 7, "markRead": 2},
    "triggered": 5,
    "errors": 1,
    "somethingNewer": {"ignored": True},
}


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0s"),
        (9_999, "9s"),
        (312_000, "5m 12s"),
        (7_500_000, "2h 5m"),
        (273_600_000, "3d 4h"),
    ],
)
def test_uptime_shows_the_two_largest_units(ms: int, text: str) -> None:
    assert format_uptime(ms) == text


def test_camel_case_snapshot_reads_as_snake_case() -> None:
    out = Snapshot.from_json(BOTMESH_JSON).to_json()
    assert out["started_at"] == "2025-05-01T12:00:00.000Z"
    assert out["uptime"] == "3d 4h"
    assert out["conversations"]["timed_out"] == 1
    assert out["conversations"]["avg_duration_ms"] == 5400.5
    assert out["flows"]["checkout"]["completed"] == 3
    assert out["messages"] == {"in": 120, "out": 100, "out_failed": 2}
    assert out["presence_skipped"] == {"typing": 7, "mark_read": 2}
    assert "somethingNewer" not in out


def test_snapshot_round_trips_through_its_own_json() -> None:
    first = Snapshot.from_json(BOTMESH_JSON)
    assert Snapshot.from_json(first.to_json()) == first


def test_missing_counters_are_zero_and_uptime_follows_started_at() -> None:
    snap = Snapshot.from_json({"startedAt": 1_000_000}, now_ms=1_061_000)
    assert snap.uptime_ms == 61_000
    assert snap.messages.in_ == 0 and snap.flows == ()


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"messages": {"in": -1}}, "snapshot.messages.in"),
        ({"messages": {"in": "12"}}, "snapshot.messages.in"),
        ({"conversations": {"timedOut": 1.5}}, "snapshot.conversations.timed_out"),
        ({"conversations": {"avgDurationMs": float("nan")}}, "snapshot.conversations.avg_duration_ms"),
        ({"errors": True}, "snapshot.errors"),
        ({"flows": []}, "snapshot.flows"),
        ({"flows": {"pay": {"started": -2}}}, "snapshot.flows.pay.started"),
        ({"startedAt": "yesterday"}, "snapshot.started_at"),
        ({"dropped": "none"}, "snapshot.dropped"),
    ],
)
def test_a_bad_field_is_refused_with_its_path(patch: dict, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        Snapshot.from_json({**BOTMESH_JSON, **patch})
    assert err.value.field == field
