"""Trace records as the dashboard keeps them: spans merged by trace id, and their summary.

A *span dict* (made by ``tracing.span_to_dict`` from an exported, already
guarded span) is::

    {"span_id": "9f…", "parent_id": "1c…" | None, "name": "message.send", "kind": "internal",
     "start_ms": 1714564800123.456, "duration_ms": 12.5, "status": "ok" | "error" | "unset",
     "attributes": {...}, "events": [{"name", "offset_ms", "attributes"}], "scope": "…", "service": "…"}

A *trace record* is ``{"trace_id", "tenant", "first_seen_ms", "spans": [...], "dropped_spans"}``.

Lists order traces by when they *started* (the earliest span's start, whole
ms), newest first: the time a list row shows. ``first_seen_ms`` (when the
store first wrote the trace) is only the fallback of a trace with no span.

What is kept, per kind (``KEEP``): every kind has its own quota, so traces of
one kind never evict another's; message traces (webhook or ledger record →
projection → reply) keep the most, and every trace expires after the
retention (24 h).
"""

from __future__ import annotations

from typing import Any

from .stores.base import TraceSummary

MAX_SPANS = 256
KINDS = ("http", "task", "message", "internal")
KEEP = {"message": 5000, "http": 500, "task": 500, "internal": 500}
"""The newest traces kept per kind (README: Metrics and traces); each also expires after 24 h."""
MESSAGE_HASHES = "botmesh.message_id_hashes"  # ``hash_id`` of the inbox message ids a span projected
MAX_MESSAGES = 16  # message hashes a trace is findable by (a webhook batch holds a few)
MESSAGE_PREFIXES = ("message.", "inbox.")
INDEX_BASE = 10**13  # epoch ms stays below this until the year 2286


def merge_trace(
    record: dict[str, Any] | None, trace_id: str, tenant: str | None, spans: list[dict[str, Any]], now_ms: int
) -> dict[str, Any]:
    """Return ``record`` with ``spans`` merged in (same span id: the newer copy wins), at most ``MAX_SPANS``."""
    if record is None:
        record = {"trace_id": trace_id, "tenant": tenant, "first_seen_ms": now_ms, "spans": [], "dropped_spans": 0}
    by_id = {s["span_id"]: s for s in record["spans"]}
    for span in spans:
        by_id[span["span_id"]] = span
    ordered = sorted(by_id.values(), key=lambda s: (s["start_ms"], s["span_id"]))
    dropped = record.get("dropped_spans", 0) + max(0, len(ordered) - MAX_SPANS)
    return {**record, "spans": ordered[:MAX_SPANS], "dropped_spans": dropped}


def started_ms(record: dict[str, Any]) -> int:
    """Return when the trace started: its earliest span's start (epoch ms, whole), else ``first_seen_ms``."""
    spans = record.get("spans") or ()
    return int(min((s["start_ms"] for s in spans), default=float(record["first_seen_ms"])))


def index_key(record: dict[str, Any]) -> str:
    """Return the key that orders the trace newest first: ``r/<inverted started_ms>/<trace_id>``."""
    return cursor_of(started_ms(record), record["trace_id"])


def cursor_of(started: int, trace_id: str) -> str:
    """Return the list cursor of the trace ``trace_id`` that started at ``started`` (epoch ms)."""
    return f"r/{INDEX_BASE - 1 - int(started):013d}/{trace_id}"


def message_hashes(spans: list[dict[str, Any]]) -> list[str]:
    """Return the message hashes (``MESSAGE_HASHES``) the trace's spans name, at most ``MAX_MESSAGES``."""
    out: dict[str, None] = {}
    for s in spans:
        value = s.get("attributes", {}).get(MESSAGE_HASHES)
        for h in [value] if isinstance(value, str) else (value or ()):
            out[str(h)] = None
    return list(out)[:MAX_MESSAGES]


def trace_kind(spans: list[dict[str, Any]], root: dict[str, Any] | None) -> str:
    """Return ``message`` if any span is on the message path (``message.*``, ``inbox.*``), else the root's kind."""
    if any(s["name"].startswith(MESSAGE_PREFIXES) for s in spans):
        return "message"
    if root is None:
        return "internal"
    explicit = root.get("attributes", {}).get("botmesh.kind")
    if explicit in KINDS:
        return str(explicit)
    scope = root.get("scope") or ""
    if "django" in scope or "wsgi" in scope:
        return "http"
    if "celery" in scope:
        return "task"
    return "internal"


def summarize(record: dict[str, Any]) -> TraceSummary:
    """Return the list line of a trace record: its root span's name, kind, total duration, status."""
    spans = record["spans"]
    ids = {s["span_id"] for s in spans}
    roots = [s for s in spans if not s.get("parent_id") or s["parent_id"] not in ids]
    root = min(roots, key=lambda s: s["start_ms"]) if roots else None
    start = min((s["start_ms"] for s in spans), default=float(record["first_seen_ms"]))
    end = max((s["start_ms"] + s["duration_ms"] for s in spans), default=start)
    conversation = next(
        (
            str(s["attributes"]["botmesh.conversation_id"])
            for s in spans
            if "botmesh.conversation_id" in s.get("attributes", {})
        ),
        None,
    )
    return TraceSummary(
        trace_id=record["trace_id"],
        name=root["name"] if root else "(incomplete)",
        kind=trace_kind(spans, root),
        start_ms=start,
        duration_ms=round(end - start, 3),
        span_count=len(spans) + record.get("dropped_spans", 0),
        status="error" if any(s.get("status") == "error" for s in spans) else "ok",
        conversation=conversation,
    )


def matches(summary: TraceSummary, kind: str | None, conversation: str | None) -> bool:
    """Return True if ``summary`` passes the list filters."""
    return (kind is None or summary.kind == kind) and (conversation is None or summary.conversation == conversation)


def span_tree(spans: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """Return ``(depth, span)`` in tree order (children after their parent, by start time)."""
    ids = {s["span_id"] for s in spans}
    children: dict[str | None, list[dict[str, Any]]] = {}
    for span in sorted(spans, key=lambda s: s["start_ms"]):
        parent = span.get("parent_id") if span.get("parent_id") in ids else None
        children.setdefault(parent, []).append(span)
    out: list[tuple[int, dict[str, Any]]] = []
    stack = [(0, s) for s in reversed(children.get(None, []))]
    while stack:
        depth, span = stack.pop()
        out.append((depth, span))
        stack.extend((depth + 1, c) for c in reversed(children.get(span["span_id"], [])))
    return out
