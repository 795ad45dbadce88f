"""Celery app of the worker shutdown proof: botmesh_admin's app with one slow (fake) send.

``celery -A tests.observability.worker_app worker``; the test sets ``OBS_QUEUE``
and ``OBS_PREFIX`` (a test-only module, so it reads them itself).
"""

from __future__ import annotations

import os
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "botmesh_admin.settings")
django.setup()

from botmesh_admin.celery import app  # noqa: E402
from botmesh_admin.kv import Put  # noqa: E402
from botmesh_admin.kv.runtime import default_kv  # noqa: E402
from botmesh_admin.observability import metrics, shutdown  # noqa: E402

app.conf.task_default_queue = os.environ["OBS_QUEUE"]
app.conf.broker_transport_options = {"global_keyprefix": os.environ["OBS_PREFIX"] + ":"}


@app.task(name="tests.observability.slow_send")
def slow_send(seconds: float) -> None:
    """Mark the send started, take ``seconds`` (the provider call), then record it."""
    with shutdown.inflight():
        default_kv().commit("obs-proof/marks", [Put("started", os.getpid())])
        time.sleep(seconds)
        metrics.count("messages.out")
