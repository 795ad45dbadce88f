"""``/api/v1/tenants/{tenant}/`` — bots push metric snapshots; read them and recent traces."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.urls import register_converter
from ninja import Field, Query, Router, Schema
from ninja.responses import Status
from pydantic import BaseModel, ConfigDict

from botmesh_admin.api import CursorParams, ErrorOut, Page, one_of, principal, requires
from botmesh_admin.errors import ValidationError

from . import selectors, services
from .domain import iso_ms
from .stores.base import BotSample, TraceSummary
from .trace_records import KINDS

router = Router(tags=["observability"])


class AnyTextConverter:
    """A path segment of any text, ``/`` and newlines included (a bot id is any Unicode text).

    Django's ``path`` converter (``.+``) stops at a newline; a client
    percent-escapes the id (``quote(bot, safe="")``) and Django decodes it.
    """

    regex = r"[\s\S]+"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(AnyTextConverter, "anytext")


class MetricsPushIn(BaseModel):
    """What ``bot.metrics()`` returns (camelCase or snake_case), plus the pushing replica's id."""

    # A plain pydantic model: ninja's Schema would drop the snapshot's fields (extras).
    model_config = ConfigDict(extra="allow")

    replica: str | None = Field(None, max_length=128, description="replica id (host or pod name); also as replicaId")


class BotSampleOut(Schema):
    bot: str
    replica: str
    received_at: str
    received_at_ms: int
    seq: int
    snapshot: dict[str, Any]


class TraceSummaryOut(Schema):
    trace_id: str
    name: str
    kind: str
    start_ms: float
    duration_ms: float
    span_count: int
    status: str
    conversation: str | None = None


class SpanOut(Schema):
    span_id: str
    parent_id: str | None
    name: str
    kind: str
    start_ms: float
    duration_ms: float
    status: str
    attributes: dict[str, Any]
    events: list[dict[str, Any]]
    service: str | None = None
    depth: int = 0


class TraceOut(Schema):
    trace_id: str
    summary: TraceSummaryOut
    spans: list[SpanOut]


class TraceFilter(CursorParams):
    kind: str | None = one_of(KINDS, None, description="http, task, message or internal")
    conversation: str | None = Field(None, max_length=selectors.MAX_CONVERSATION_FILTER)


def _sample_out(sample: BotSample) -> BotSampleOut:
    return BotSampleOut(
        bot=sample.bot,
        replica=sample.replica,
        received_at=iso_ms(sample.received_at_ms),
        received_at_ms=sample.received_at_ms,
        seq=sample.seq,
        snapshot=sample.snapshot,
    )


def _summary_out(summary: TraceSummary) -> TraceSummaryOut:
    return TraceSummaryOut(**summary.__dict__)


@router.post("bots/{anytext:bot}/metrics", response={201: BotSampleOut, 404: ErrorOut, 422: ErrorOut})
@requires("bot")
def bot_metrics_push(request: HttpRequest, tenant: str, bot: str, body: MetricsPushIn) -> Status[BotSampleOut]:
    """Keep one snapshot pushed by a replica of ``bot`` (the JSON of botmesh's ``bot.metrics()``).

    The body is the snapshot itself (or ``{"snapshot": {...}}``) with ``replica``
    (or ``replicaId``) and, optionally, ``at``: when it was taken, epoch ms
    within the last 24 hours (default: now). Needs a bot (or admin) token; a bot token pushes only as
    its own bot (403 ``permission_denied`` for another).
    """
    from .domain import validate_bot_id

    principal(request).require_bot(validate_bot_id(bot, "bot"))
    data = body.model_dump()
    replica = data.pop("replica", None) or data.pop("replicaId", None)
    if replica is None:
        raise ValidationError("replica", "is required (the id of the replica that pushes)")
    at = data.pop("at", None)
    snapshot = data.pop("snapshot", None) if isinstance(data.get("snapshot"), dict) else data
    sample = services.bot_metrics_push(tenant, bot=bot, replica=replica, snapshot=snapshot, received_at_ms=at)
    return Status(201, _sample_out(sample))


@router.get("bots/metrics", response={200: list[BotSampleOut]})
@requires("agent")
def bot_metrics_latest(request: HttpRequest, tenant: str) -> list[BotSampleOut]:
    """Return the latest snapshot of every live replica of every bot of the tenant."""
    principal(request)
    return [_sample_out(s) for s in selectors.bot_metrics_latest(tenant)]


@router.get("bots/{anytext:bot}/metrics", response={200: list[BotSampleOut], 404: ErrorOut, 422: ErrorOut})
@requires("agent")
def bot_metrics_history(
    request: HttpRequest, tenant: str, bot: str, replica: str, since_ms: int | None = None
) -> list[BotSampleOut]:
    """Return the kept snapshots of one replica of ``bot``, oldest first (``since_ms``: epoch ms, exclusive)."""
    principal(request)
    return [_sample_out(s) for s in selectors.bot_metrics_history(tenant, bot=bot, replica=replica, since_ms=since_ms)]


@router.get("traces", response={200: Page[TraceSummaryOut], 422: ErrorOut})
@requires("agent")
def trace_list(request: HttpRequest, tenant: str, params: Query[TraceFilter]) -> dict[str, Any]:
    """Return the tenant's recent traces, newest first (filters: ``kind``, ``conversation``)."""
    principal(request)
    items, next_cursor = selectors.trace_list(
        tenant, kind=params.kind, conversation=params.conversation, limit=params.limit, after=params.after
    )
    return {"items": [_summary_out(s) for s in items], "next": next_cursor}


@router.get("traces/{trace_id}", response={200: TraceOut, 404: ErrorOut})
@requires("agent")
def trace_get(request: HttpRequest, tenant: str, trace_id: str) -> TraceOut:
    """Return one trace of the tenant with its spans in tree order (``depth`` per span)."""
    principal(request)
    trace = selectors.trace_get(tenant, trace_id)
    spans = [SpanOut(**{**span, "depth": depth}) for depth, span in trace["tree"]]
    return TraceOut(trace_id=trace["trace_id"], summary=_summary_out(trace["summary"]), spans=spans)
