"""Reads of observability data: latest and historic bot snapshots, chart series, traces."""

from __future__ import annotations

import re
from typing import Any

from botmesh_admin.cursors import cursor_check
from botmesh_admin.errors import NotFound, ValidationError
from botmesh_admin.kv.tenant import validate_id
from botmesh_admin.validation import validate_text

from . import stores, trace_records
from .domain import validate_bot_id, validate_replica_id
from .stores.base import BotSample, TraceSummary

TRACE_ID_RE = re.compile(r"^[0-9a-f]{32}$")
TRACE_CURSOR = re.compile(r"r/[0-9]{13}/[0-9a-f]{32}")  # ``trace_records.index_key`` of a page's last trace
TRACE_KINDS = trace_records.KINDS


def bot_metrics_latest(tenant: str, *, bot: str | None = None) -> list[BotSample]:
    """Return the latest sample of each live replica of the tenant's bots (of ``bot`` if given)."""
    validate_id(tenant, "tenant")
    if bot is not None:
        validate_bot_id(bot)
    return stores.bot_metrics_store().latest(tenant, bot=bot)


def bot_metrics_history(tenant: str, *, bot: str, replica: str, since_ms: int | None = None) -> list[BotSample]:
    """Return the kept samples of one replica, oldest first; ``NotFound`` if it never pushed (or expired)."""
    validate_id(tenant, "tenant")
    validate_bot_id(bot)
    validate_replica_id(replica)
    samples = stores.bot_metrics_store().history(tenant, bot=bot, replica=replica, since_ms=since_ms)
    if not samples and since_ms is None:
        raise NotFound(f"no metrics for bot {bot!r} replica {replica!r}")
    return samples


def bot_metrics_all_latest(*, now_ms: int, live_ms: int) -> list[tuple[str, BotSample]]:
    """Return ``(tenant, sample)`` for every tenant's live replicas (for ``/metrics`` only).

    A replica is live while its last push is younger than ``live_ms``
    (``BOTMESH_METRICS_REPLICA_TTL_S``): one that stopped pushing leaves
    ``/metrics`` then, though its history stays for the metrics page.
    """
    from botmesh_admin.tenancy.selectors import tenant_ids

    out: list[tuple[str, BotSample]] = []
    for tenant in tenant_ids():
        out.extend((tenant, s) for s in stores.bot_metrics_store().latest(tenant) if s.last_push_ms > now_ms - live_ms)
    return out


def _total(sample: BotSample, group: str, key: str) -> int:
    return int(sample.snapshot.get(group, {}).get(key, 0))


SERIES = {
    "messages_in": lambda s: _total(s, "messages", "in"),
    "messages_out": lambda s: _total(s, "messages", "out"),
    "messages_out_failed": lambda s: _total(s, "messages", "out_failed"),
    "conversations_started": lambda s: _total(s, "conversations", "started"),
    "conversations_active": lambda s: _total(s, "conversations", "active"),
    "dropped": lambda s: sum(int(v) for v in s.snapshot.get("dropped", {}).values()),
    "errors": lambda s: int(s.snapshot.get("errors", 0)),
}
RATES = ("messages_in", "messages_out", "messages_out_failed", "errors")


def bot_metrics_series(tenant: str, *, bot: str, since_ms: int | None = None) -> dict[str, Any]:
    """Return chart data of ``bot``: per replica, points ``{t, <series>…, <rate>_per_min…}``.

    ``t`` is epoch ms. A rate is the counter's increase per minute since the
    previous point; a counter that went down (the replica restarted) counts
    from zero again.
    """
    out: dict[str, Any] = {"bot": bot, "replicas": {}}
    for latest in bot_metrics_latest(tenant, bot=bot):
        samples = stores.bot_metrics_store().history(tenant, bot=bot, replica=latest.replica, since_ms=since_ms)
        points = []
        previous: dict[str, Any] | None = None
        for sample in samples:
            point: dict[str, Any] = {"t": sample.received_at_ms}
            point.update({name: value(sample) for name, value in SERIES.items()})
            for name in RATES:
                if previous is None or point["t"] <= previous["t"]:
                    point[f"{name}_per_min"] = None
                else:
                    delta = point[name] - previous[name]
                    if delta < 0:
                        delta = point[name]
                    point[f"{name}_per_min"] = round(delta * 60000 / (point["t"] - previous["t"]), 3)
            points.append(point)
            previous = point
        out["replicas"][latest.replica] = points
    return out


MAX_CONVERSATION_FILTER = 200  # characters of the traces' conversation filter (the API declares the same bound)


def trace_list(
    tenant: str | None,
    *,
    kind: str | None = None,
    conversation: str | None = None,
    limit: int = 50,
    after: str | None = None,
) -> tuple[list[TraceSummary], str | None]:
    """Return the newest traces of ``tenant`` (``None``: traces of no tenant) and the next cursor.

    Raise ``ValidationError`` naming ``kind``, ``conversation`` (at most
    ``MAX_CONVERSATION_FILTER`` characters, no control character) or ``after`` for a bad filter.
    """
    if tenant is not None:
        validate_id(tenant, "tenant")
    if kind is not None and kind not in TRACE_KINDS:
        raise ValidationError("kind", f"must be one of {', '.join(TRACE_KINDS)}")
    if conversation:
        validate_text(conversation, "conversation", max_len=MAX_CONVERSATION_FILTER, blank=True)
    after = cursor_check(after, TRACE_CURSOR)
    return stores.trace_store().list(tenant, kind=kind, conversation=conversation or None, limit=limit, after=after)


def trace_get(tenant: str | None, trace_id: str) -> dict[str, Any]:
    """Return ``{"trace_id", "summary", "spans", "tree": [(depth, span)]}``; ``NotFound`` if not kept here."""
    if not TRACE_ID_RE.fullmatch(trace_id or ""):
        raise NotFound(f"trace {trace_id!r} not found")
    record = stores.trace_store().get(tenant, trace_id)
    if record is None:
        raise NotFound(f"trace {trace_id!r} not found")
    return {**record, "tree": trace_records.span_tree(record["spans"])}


def trace_of_message(tenant: str, message_id: str) -> str:
    """Return the id of the newest kept trace that projected (or sent) the inbox message ``message_id``.

    Traces name messages by ``hash_id`` only (``trace_records.MESSAGE_HASHES``),
    so the lookup hashes the id: one index entry read. Raise ``NotFound`` when
    no trace of it is kept (older than the retention, or before traces named
    their messages) and ``ValidationError`` (field ``id``) for an empty id.
    """
    from .guard import hash_id

    validate_id(tenant, "tenant")
    if not isinstance(message_id, str) or not message_id.strip() or len(message_id) > 512:
        raise ValidationError("id", "must be a message id")
    found = stores.trace_store().of_message(tenant, hash_id(message_id))
    if found is None:
        raise NotFound("no trace of this message is kept (traces are kept for 24 hours)")
    return found
