"""Metric snapshots with the botmesh shape, validated (ARCHITECTURE §10).

A *snapshot* is what ``bot.metrics()`` of a botmesh bot returns, and what
``metrics.snapshot()`` returns for this process::

    {"started_at": "2025-05-01T12:00:00.000Z", "uptime_ms": 185000, "uptime": "3m 5s",
     "conversations": {"started", "completed", "ended", "guarded", "cancelled", "timed_out",
                       "retries_exceeded", "errored", "avg_duration_ms", "active"},
     "flows": {"<flow>": {same keys as conversations}},
     "messages": {"in", "out", "out_failed"},
     "dropped": {"duplicate", "blocked", "handoff"},
     "presence_skipped": {"typing", "mark_read"},
     "triggered": int, "errors": int}

``Snapshot.from_json`` accepts snake_case or botmesh's camelCase keys
(``startedAt``, ``uptimeMs``, ``avgDurationMs``, ``timedOut``, ``retriesExceeded``,
``outFailed``, ``presenceSkipped``, ``markRead``), ignores keys it does not know
(newer bots), defaults missing counters to 0 and raises ``ValidationError``
naming the field path for a wrong type or a negative count. Durations are ms.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from botmesh_admin.errors import BadType, ValidationError
from botmesh_admin.validation import refuse_lone_surrogate

OUTCOMES = ("completed", "ended", "guarded", "cancelled", "timed_out", "retries_exceeded", "errored")
"""How a conversation (or a flow) ends; ``errored`` ends with an error."""

MAX_COUNT = 2**53  # JSON numbers stay exact up to here (JavaScript bots)
MAX_FLOWS = 200
MAX_NAME = 100
"""Characters of a flow name."""
MAX_BOT = 63
"""Characters of a bot id."""
MAX_REPLICA = 128
"""Characters of a replica id."""

_CAMEL = {
    "startedAt": "started_at",
    "uptimeMs": "uptime_ms",
    "avgDurationMs": "avg_duration_ms",
    "timedOut": "timed_out",
    "retriesExceeded": "retries_exceeded",
    "outFailed": "out_failed",
    "presenceSkipped": "presence_skipped",
    "markRead": "mark_read",
}


@dataclass(frozen=True)
class OutcomeCounts:
    """Counters of conversations (or of one flow): started, each outcome, average duration, active."""

    started: int = 0
    completed: int = 0
    ended: int = 0
    guarded: int = 0
    cancelled: int = 0
    timed_out: int = 0
    retries_exceeded: int = 0
    errored: int = 0
    avg_duration_ms: float = 0.0
    active: int = 0

    def outcome(self, name: str) -> int:
        """Return the count of outcome ``name`` (one of ``OUTCOMES``)."""
        return int(getattr(self, name))


@dataclass(frozen=True)
class MessageCounts:
    """Messages received (``in_``), sent (``out``) and sends that failed (``out_failed``)."""

    in_: int = 0
    out: int = 0
    out_failed: int = 0


@dataclass(frozen=True)
class DroppedCounts:
    """Inbound messages dropped: redeliveries, blocked senders, chats in human handoff."""

    duplicate: int = 0
    blocked: int = 0
    handoff: int = 0


@dataclass(frozen=True)
class PresenceSkipped:
    """Presence signals not sent (typing indicator, mark-as-read)."""

    typing: int = 0
    mark_read: int = 0


@dataclass(frozen=True)
class Snapshot:
    """One metrics snapshot. ``started_at_ms`` is epoch ms (``None`` if the bot did not say)."""

    started_at_ms: int | None = None
    uptime_ms: int = 0
    conversations: OutcomeCounts = field(default_factory=OutcomeCounts)
    flows: tuple[tuple[str, OutcomeCounts], ...] = ()
    messages: MessageCounts = field(default_factory=MessageCounts)
    dropped: DroppedCounts = field(default_factory=DroppedCounts)
    presence_skipped: PresenceSkipped = field(default_factory=PresenceSkipped)
    triggered: int = 0
    errors: int = 0

    def to_json(self) -> dict[str, Any]:
        """Return the snake_case JSON shape (see the module docstring)."""
        return {
            "started_at": iso_ms(self.started_at_ms) if self.started_at_ms is not None else None,
            "uptime_ms": self.uptime_ms,
            "uptime": format_uptime(self.uptime_ms),
            "conversations": _counts_json(self.conversations),
            "flows": {name: _counts_json(counts) for name, counts in self.flows},
            "messages": {
                "in": self.messages.in_,
                "out": self.messages.out,
                "out_failed": self.messages.out_failed,
            },
            "dropped": {
                "duplicate": self.dropped.duplicate,
                "blocked": self.dropped.blocked,
                "handoff": self.dropped.handoff,
            },
            "presence_skipped": {
                "typing": self.presence_skipped.typing,
                "mark_read": self.presence_skipped.mark_read,
            },
            "triggered": self.triggered,
            "errors": self.errors,
        }

    @classmethod
    def from_json(cls, data: object, path: str = "snapshot", *, now_ms: int | None = None) -> Snapshot:
        """Validate a snapshot in snake_case or camelCase JSON and return it.

        ``uptime_ms`` defaults to ``now_ms - started_at`` when only ``started_at``
        is given. Raise ``ValidationError`` naming the field path
        (``snapshot.conversations.timed_out: must be a non-negative integer``).
        """
        obj = _object(data, path)
        if not any(obj.get(name) is not None for name in SNAPSHOT_SECTIONS):
            raise ValidationError(
                path, f"holds none of {', '.join(SNAPSHOT_SECTIONS)} (is it a bot.metrics() snapshot?)"
            )
        started_at = _started_at(obj.get("started_at"), f"{path}.started_at")
        uptime = obj.get("uptime_ms")
        if uptime is None:
            uptime_ms = max(0, now_ms - started_at) if (started_at is not None and now_ms is not None) else 0
        else:
            uptime_ms = _count(uptime, f"{path}.uptime_ms")
        flows_raw = _or_empty(obj.get("flows"))
        if not isinstance(flows_raw, Mapping):
            raise BadType(f"{path}.flows", "must be an object of flow name to counters")
        if len(flows_raw) > MAX_FLOWS:
            raise ValidationError(f"{path}.flows", f"at most {MAX_FLOWS} flows")
        flows = []
        for name, counts in flows_raw.items():
            _flow_name(name, f"{path}.flows")
            flows.append((name, _outcome_counts(counts, f"{path}.flows.{name}")))
        messages = _object(_or_empty(obj.get("messages")), f"{path}.messages")
        dropped = _object(_or_empty(obj.get("dropped")), f"{path}.dropped")
        presence = _object(_or_empty(obj.get("presence_skipped")), f"{path}.presence_skipped")
        return cls(
            started_at_ms=started_at,
            uptime_ms=uptime_ms,
            conversations=_outcome_counts(_or_empty(obj.get("conversations")), f"{path}.conversations"),
            flows=tuple(sorted(flows)),
            messages=MessageCounts(
                in_=_count(messages.get("in", 0), f"{path}.messages.in"),
                out=_count(messages.get("out", 0), f"{path}.messages.out"),
                out_failed=_count(messages.get("out_failed", 0), f"{path}.messages.out_failed"),
            ),
            dropped=DroppedCounts(
                **{k: _count(dropped.get(k, 0), f"{path}.dropped.{k}") for k in ("duplicate", "blocked", "handoff")}
            ),
            presence_skipped=PresenceSkipped(
                **{k: _count(presence.get(k, 0), f"{path}.presence_skipped.{k}") for k in ("typing", "mark_read")}
            ),
            triggered=_count(obj.get("triggered", 0), f"{path}.triggered"),
            errors=_count(obj.get("errors", 0), f"{path}.errors"),
        )


def _counts_json(counts: OutcomeCounts) -> dict[str, Any]:
    return {f.name: getattr(counts, f.name) for f in fields(counts)}


def format_uptime(ms: int) -> str:
    """Return a duration in ms as its two largest units: ``"3d 4h"``, ``"2h 5m"``, ``"5m 12s"``, ``"9s"``."""
    seconds = max(0, int(ms)) // 1000
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"


def iso_ms(epoch_ms: int) -> str:
    """Return epoch milliseconds as ISO 8601 UTC with milliseconds (``2025-05-01T12:00:00.000Z``)."""
    moment = datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{epoch_ms % 1000:03d}Z"


class MetricsLimitExceeded(ValidationError):
    """A push would put one more live bot or replica on ``/metrics`` than a cap allows. HTTP 422.

    ``field`` is ``bot`` or ``replica``; the body also names the setting
    (``limit``: ``BOTMESH_METRICS_MAX_BOTS`` or ``BOTMESH_METRICS_MAX_REPLICAS``)
    and its value (``max``).
    """

    code = "limit_exceeded"

    def __init__(self, field: str, problem: str, *, limit: str, maximum: int) -> None:
        super().__init__(field, problem)
        self.details = {"limit": limit, "max": maximum}


def label_text(value: object, path: str, max_len: int) -> str:
    """Return ``value`` if it may be a Prometheus label value: 1 to ``max_len`` characters of Unicode text.

    Any character is allowed — quotes, backslashes, newlines, any script —
    because the text exposition format 0.0.4 carries any UTF-8 label value,
    escaping only ``\\``, ``"`` and line feed (``prometheus.to_prometheus``
    does). Refused: a non-string, the empty string, more than ``max_len``
    characters, and a lone surrogate (JSON's ``"\\ud800"``, which is not
    Unicode text and has no UTF-8 form). Raise ``ValidationError`` naming ``path``.
    """
    if not isinstance(value, str):
        raise BadType(path, f"must be a string, not {type(value).__name__}")
    if not value:
        raise ValidationError(path, "must not be empty")
    if len(value) > max_len:
        raise ValidationError(path, f"longer than {max_len} characters")
    refuse_lone_surrogate(value, path)
    return value


def validate_bot_id(value: object, path: str = "bot") -> str:
    """Return ``value`` if it is a bot id: any Unicode text of 1-63 characters (``label_text``)."""
    return label_text(value, path, MAX_BOT)


def validate_replica_id(value: object, path: str = "replica") -> str:
    """Return ``value`` if it is a replica id (host or pod name): any Unicode text of 1-128 characters."""
    return label_text(value, path, MAX_REPLICA)


SNAPSHOT_SECTIONS = ("started_at", "uptime_ms", "conversations", "flows", "messages", "dropped", "presence_skipped")


def _or_empty(value: object) -> object:
    return {} if value is None else value


def _object(data: object, path: str) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise BadType(path, f"must be an object, not {type(data).__name__}")
    out: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise BadType(path, f"key {key!r} is not a string")
        out[_CAMEL.get(key, key)] = value
    return out


def _outcome_counts(data: object, path: str) -> OutcomeCounts:
    obj = _object(data, path)
    values: dict[str, Any] = {}
    for f in fields(OutcomeCounts):
        raw = obj.get(f.name, 0)
        if f.name == "avg_duration_ms":
            values[f.name] = _duration(raw, f"{path}.{f.name}")
        else:
            values[f.name] = _count(raw, f"{path}.{f.name}")
    return OutcomeCounts(**values)


def _count(value: object, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadType(path, "must be a non-negative integer")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValidationError(path, "must be a non-negative integer")
        value = int(value)
    if not 0 <= value <= MAX_COUNT:
        raise ValidationError(path, f"must be a non-negative integer up to {MAX_COUNT}")
    return int(value)


def _duration(value: object, path: str) -> float:
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadType(path, "must be a non-negative number of milliseconds")
    if not math.isfinite(value) or value < 0 or value > MAX_COUNT:
        raise ValidationError(path, "must be a non-negative number of milliseconds")
    return float(value)


def _flow_name(name: str, path: str) -> None:
    # The path names the flow by its repr when it is not plain (a newline would split the message's line).
    shown = name[:MAX_NAME] if name.isprintable() else repr(name[:MAX_NAME])
    label_text(name, f"{path}.{shown}", MAX_NAME)


def _started_at(value: object, path: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        try:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
        except ValueError:
            raise ValidationError(path, "must be an ISO 8601 time or epoch milliseconds") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return int(moment.timestamp() * 1000)
    return _count(value, path)
