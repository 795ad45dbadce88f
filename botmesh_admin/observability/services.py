"""Writes of observability data: snapshots pushed by bots, finished traces."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from botmesh_admin.kv.tenant import validate_id
from botmesh_admin.kv.validation import now_ms

from . import stores
from .domain import snapshot_from_json, validate_bot_id, validate_replica_id
from .stores.base import BotSample


def bot_metrics_push(
    tenant: str, *, bot: str, replica: str, snapshot: Mapping[str, Any], received_at_ms: int | None = None
) -> BotSample:
    """Validate and keep one snapshot pushed by ``bot``'s ``replica`` (camelCase or snake_case JSON).

    ``received_at_ms`` (epoch ms) defaults to now. Return the stored sample.
    Raise ``ValidationError`` naming the field (``snapshot.messages.in: …``).
    """
    validate_id(tenant, "tenant")
    validate_bot_id(bot, "bot")
    validate_replica_id(replica, "replica")
    at = now_ms() if received_at_ms is None else received_at_ms
    parsed = snapshot_from_json(snapshot, "snapshot", now_ms=at)
    return stores.bot_metrics_store().push(
        tenant, bot=bot, replica=replica, snapshot=parsed.to_json(), received_at_ms=at
    )


def trace_record(tenant: str | None, spans: list[dict[str, Any]]) -> None:
    """Merge finished spans of one trace into the recent traces of ``tenant`` (``None``: no tenant)."""
    if tenant is not None:
        validate_id(tenant, "tenant")
    stores.trace_store().record(tenant, spans)
