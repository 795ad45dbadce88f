"""Writes of observability data: snapshots pushed by bots, finished traces."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from botmesh_admin.clock import now_ms
from botmesh_admin.errors import ValidationError
from botmesh_admin.kv.tenant import validate_id

from . import stores
from .domain import Snapshot, validate_bot_id, validate_replica_id
from .stores.base import BotSample, PushLimits
from .stores.memory import DEFAULT_RETENTION_MS


def bot_metrics_push(
    tenant: str, *, bot: str, replica: str, snapshot: Mapping[str, Any], received_at_ms: int | None = None
) -> BotSample:
    """Validate and keep one snapshot pushed by ``bot``'s ``replica`` (camelCase or snake_case JSON).

    ``received_at_ms`` (epoch ms; field ``at`` in the API) defaults to now and
    must lie within the retention window (24 h back, 1 min ahead). Return the
    stored sample. Raise ``ValidationError`` naming the field (``snapshot.messages.in: …``),
    and ``MetricsLimitExceeded`` (422) when a replica that is not live would
    exceed ``BOTMESH_METRICS_MAX_REPLICAS`` for its bot or, for a bot with no
    live replica, ``BOTMESH_METRICS_MAX_BOTS`` for the tenant.
    """
    validate_id(tenant, "tenant")
    validate_bot_id(bot, "bot")
    validate_replica_id(replica, "replica")
    now = now_ms()
    at = now if received_at_ms is None else received_at_ms
    if isinstance(at, bool) or not isinstance(at, int) or not now - DEFAULT_RETENTION_MS < at <= now + 60_000:
        raise ValidationError("at", "must be epoch milliseconds within the last 24 hours")
    parsed = Snapshot.from_json(snapshot, "snapshot", now_ms=at)
    return stores.bot_metrics_store().push(
        tenant,
        bot=bot,
        replica=replica,
        snapshot=parsed.to_json(),
        received_at_ms=at,
        pushed_at_ms=now,
        limits=push_limits(),
    )


def push_limits() -> PushLimits:
    """Return the caps of pushed metrics from the settings (``BOTMESH_METRICS_*``, README: Metrics and traces)."""
    from django.conf import settings

    return PushLimits(
        max_bots=settings.BOTMESH_METRICS_MAX_BOTS,
        max_replicas=settings.BOTMESH_METRICS_MAX_REPLICAS,
        live_ms=settings.BOTMESH_METRICS_REPLICA_TTL_S * 1000,
    )


def trace_record(tenant: str | None, spans: list[dict[str, Any]]) -> None:
    """Merge finished spans of one trace into the recent traces of ``tenant`` (``None``: no tenant)."""
    if tenant is not None:
        validate_id(tenant, "tenant")
    stores.trace_store().record(tenant, spans)


def trace_record_many(tenant: str | None, traces: list[list[dict[str, Any]]]) -> None:
    """Merge the finished spans of several traces of ``tenant`` (``trace_record`` in batches)."""
    if tenant is not None:
        validate_id(tenant, "tenant")
    stores.trace_store().record_many(tenant, traces)
