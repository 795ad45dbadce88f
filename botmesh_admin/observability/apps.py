"""Metrics, Prometheus rendering, health, tracing and logging (ARCHITECTURE §10)."""

from __future__ import annotations

import sys
from pathlib import Path

from django.apps import AppConfig


def _is_web_server() -> bool:
    program = Path(sys.argv[0]).name if sys.argv else ""
    return "runserver" in sys.argv[1:3] or program in ("gunicorn", "uwsgi", "daphne", "uvicorn")


class ObservabilityConfig(AppConfig):
    name = "botmesh_admin.observability"
    label = "observability"
    verbose_name = "Observability"
    nav: list[tuple[str, str, str]] = [
        ("Metrics", "observability:metrics", "agent"),
        ("Traces", "observability:traces", "agent"),
    ]

    def ready(self) -> None:
        """Start tracing and log filtering (idempotent); hook Celery worker start/stop; SIGTERM for web servers."""
        from celery import signals

        from . import logs, metrics, shutdown, tracing

        tracing.setup()
        logs.install()
        signals.after_setup_logger.connect(lambda logger=None, **_: logs.install(logger), weak=False)
        signals.worker_process_init.connect(tracing.setup_worker_child, weak=False)
        signals.worker_process_shutdown.connect(tracing.force_flush, weak=False)
        signals.worker_process_shutdown.connect(lambda **_: metrics.flush(), weak=False)
        signals.worker_shutting_down.connect(shutdown.on_worker_shutting_down, weak=False)
        if _is_web_server():
            shutdown.install()
