"""Stores of observability data: process counters, pushed bot snapshots, recent traces."""

from __future__ import annotations

import threading

from botmesh_admin.kv.runtime import default_kv

from .kv import KvBotMetricsStore, KvTraceStore

_lock = threading.Lock()
_bot_metrics: KvBotMetricsStore | None = None
_traces: KvTraceStore | None = None


def bot_metrics_store() -> KvBotMetricsStore:
    """Return the bot metrics store over the default Kv (one instance per Kv)."""
    global _bot_metrics
    kv = default_kv()
    with _lock:
        if _bot_metrics is None or _bot_metrics.kv is not kv:
            _bot_metrics = KvBotMetricsStore(kv)
        return _bot_metrics


def trace_store() -> KvTraceStore:
    """Return the trace store over the default Kv (one instance per Kv, so pruning counts carry on)."""
    global _traces
    kv = default_kv()
    with _lock:
        if _traces is None or _traces.kv is not kv:
            _traces = KvTraceStore(kv)
        return _traces
