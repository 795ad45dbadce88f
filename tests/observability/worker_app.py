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
    """Mark the send started, wait for the test's ``answer`` mark (the provider call; at most ``seconds``), count it."""
    with shutdown.inflight():
        kv = default_kv()
        kv.commit("obs-proof/marks", [Put("started", os.getpid())])
        give_up = time.monotonic() + seconds
        while kv.get("obs-proof/marks", "answer") is None and time.monotonic() < give_up:
            time.sleep(0.02)
        metrics.count("messages.out")
