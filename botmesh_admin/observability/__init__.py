"""Metrics, Prometheus rendering, health, tracing and logging (ARCHITECTURE §10)."""
