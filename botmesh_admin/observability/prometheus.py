"""Render snapshots as Prometheus text exposition format 0.0.4 (ARCHITECTURE §10).

Follows the format spec (prometheus.io/docs/instrumenting/exposition_formats):
one ``# HELP`` and one ``# TYPE`` line per metric family, every sample of a
family right after them (families never interleave, even across several series
sets), label values escaped (``\\`` → ``\\\\``, ``"`` → ``\\"``, newline → ``\\n``),
HELP text escaped (``\\`` and newline), and a final newline. Counters carry
the ``_total`` suffix in their family name, as 0.0.4 exposes them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .domain import OUTCOMES, Snapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

SnapshotLike = Snapshot | Mapping[str, Any]
Sample = tuple[dict[str, str], float | int]

# The outcome label says "error" where the snapshot says "errored" (botmesh's naming).
_OUTCOME_LABEL = {o: ("error" if o == "errored" else o) for o in OUTCOMES}


def _conv_ended(s: Snapshot) -> list[Sample]:
    return [({"outcome": _OUTCOME_LABEL[o]}, s.conversations.outcome(o)) for o in OUTCOMES]


def _flow_started(s: Snapshot) -> list[Sample]:
    return [({"flow": name}, c.started) for name, c in s.flows]


def _flow_ended(s: Snapshot) -> list[Sample]:
    return [({"flow": name, "outcome": _OUTCOME_LABEL[o]}, c.outcome(o)) for name, c in s.flows for o in OUTCOMES]


def _flow_duration(s: Snapshot) -> list[Sample]:
    return [({"flow": name}, c.avg_duration_ms / 1000) for name, c in s.flows]


# (name without prefix, type, help, samples of one snapshot, label names it uses)
FAMILIES: list[tuple[str, str, str, Callable[[Snapshot], list[Sample]], tuple[str, ...]]] = [
    (
        "uptime_seconds",
        "gauge",
        "Seconds since the process started (the admin: since its shared counters started).",
        lambda s: [({}, s.uptime_ms / 1000)],
        (),
    ),
    ("conversations_active", "gauge", "Conversations in progress.", lambda s: [({}, s.conversations.active)], ()),
    ("conversations_started_total", "counter", "Conversations started.", lambda s: [({}, s.conversations.started)], ()),
    ("conversations_ended_total", "counter", "Conversations ended, by outcome.", _conv_ended, ("outcome",)),
    (
        "conversation_duration_avg_seconds",
        "gauge",
        "Average duration of ended conversations in seconds.",
        lambda s: [({}, s.conversations.avg_duration_ms / 1000)],
        (),
    ),
    ("flow_started_total", "counter", "Flows started, by flow.", _flow_started, ("flow",)),
    ("flow_ended_total", "counter", "Flows ended, by flow and outcome.", _flow_ended, ("flow", "outcome")),
    (
        "flow_duration_avg_seconds",
        "gauge",
        "Average duration of ended flows in seconds, by flow.",
        _flow_duration,
        ("flow",),
    ),
    ("messages_in_total", "counter", "Inbound messages received.", lambda s: [({}, s.messages.in_)], ()),
    (
        "messages_out_total",
        "counter",
        "Outbound messages, by result (sent or failed).",
        lambda s: [({"result": "sent"}, s.messages.out), ({"result": "failed"}, s.messages.out_failed)],
        ("result",),
    ),
    (
        "inbound_dropped_total",
        "counter",
        "Inbound messages dropped, by reason.",
        lambda s: [({"reason": r}, getattr(s.dropped, r)) for r in ("duplicate", "blocked", "handoff")],
        ("reason",),
    ),
    (
        "presence_skipped_total",
        "counter",
        "Presence signals skipped, by kind.",
        lambda s: [({"kind": k}, getattr(s.presence_skipped, k)) for k in ("typing", "mark_read")],
        ("kind",),
    ),
    ("triggers_total", "counter", "Triggers fired.", lambda s: [({}, s.triggered)], ()),
    ("errors_total", "counter", "Errors raised by handlers.", lambda s: [({}, s.errors)], ()),
]
_RESERVED_LABELS = {label for *_, names in FAMILIES for label in names}


def to_prometheus(snapshot: SnapshotLike, prefix: str = "botmesh_", labels: Mapping[str, str] | None = None) -> str:
    """Return ``snapshot`` in text format 0.0.4; ``labels`` are added to every sample.

    Raise ``TypeError`` for a prefix or label name that is not a valid
    Prometheus name (``[a-zA-Z_][a-zA-Z0-9_]*``, no colon, not starting with
    the reserved ``__``) or a label name the families use themselves.
    """
    return to_prometheus_many([(snapshot, labels)], prefix=prefix)


def to_prometheus_many(
    series_sets: Iterable[tuple[SnapshotLike, Mapping[str, str] | None]], prefix: str = "botmesh_"
) -> str:
    """Render several snapshots, each with its own labels, keeping every family contiguous.

    Used by ``/metrics``: this process's snapshot plus one set per pushed bot
    and replica (labels ``tenant``, ``bot``, ``replica``). Two sets with the
    same labels would be duplicate series; the caller keeps them distinct.
    """
    _check_prefix(prefix)
    sets = [(_as_snapshot(snap), _check_labels(lbl)) for snap, lbl in series_sets]
    lines: list[str] = []
    for name, kind, help_text, samples_of, _ in FAMILIES:
        family = prefix + name
        lines.append(f"# HELP {family} {_escape_help(help_text)}")
        lines.append(f"# TYPE {family} {kind}")
        for snapshot, const in sets:
            for own, value in samples_of(snapshot):
                lines.append(f"{family}{_labels({**const, **own})} {_value(value)}")
    return "\n".join(lines) + "\n"


def _as_snapshot(snapshot: SnapshotLike) -> Snapshot:
    if isinstance(snapshot, Snapshot):
        return snapshot
    if isinstance(snapshot, Mapping):
        return Snapshot.from_json(snapshot)
    raise TypeError(f"snapshot must be a Snapshot or a mapping, not {type(snapshot).__name__}")


def _check_prefix(prefix: object) -> None:
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a string, not {type(prefix).__name__}")
    if prefix and (not _NAME_RE.fullmatch(prefix) or prefix.startswith("__")):
        raise TypeError(f"invalid metric name prefix {prefix!r}: use [a-zA-Z_][a-zA-Z0-9_]*, not starting with '__'")


def _check_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise TypeError(f"labels must be a mapping, not {type(labels).__name__}")
    out: dict[str, str] = {}
    for name, value in labels.items():
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or name.startswith("__"):
            raise TypeError(f"invalid label name {name!r}: use [a-zA-Z_][a-zA-Z0-9_]*, not starting with '__'")
        if name in _RESERVED_LABELS:
            raise TypeError(f"label name {name!r} is used by the metric families themselves")
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise TypeError(f"label {name!r} value must be a string, not {type(value).__name__}")
        out[name] = str(value)
    return out


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items()) + "}"


def _value(value: float | int) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))
