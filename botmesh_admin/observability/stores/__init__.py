"""Stores of observability data: process counters, pushed bot snapshots, recent traces."""

from __future__ import annotations

from botmesh_admin.kv.runtime import DefaultStore

from .kv import KvBotMetricsStore, KvTraceStore

# One instance per process and Kv, so a trace store's pruning counts carry on.
_bot_metrics: DefaultStore[KvBotMetricsStore] = DefaultStore(KvBotMetricsStore)
_traces: DefaultStore[KvTraceStore] = DefaultStore(KvTraceStore)


def bot_metrics_store() -> KvBotMetricsStore:
    """Return the bot metrics store over the default Kv (one instance per Kv)."""
    return _bot_metrics.get()


def trace_store() -> KvTraceStore:
    """Return the trace store over the default Kv (one instance per Kv, so pruning counts carry on)."""
    return _traces.get()
