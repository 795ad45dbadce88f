"""The Celery app. Tasks live in each app's ``tasks.py`` and are thin (STYLE §9)."""

from __future__ import annotations

import os

from celery import Celery, signals

from botmesh_admin import config

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "botmesh_admin.settings")
config.load_or_exit()

app = Celery("botmesh_admin")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(
    [
        "botmesh_admin.events",
        "botmesh_admin.coordination",
        "botmesh_admin.channels",
        "botmesh_admin.observability",
        "botmesh_admin.dashboard",
        "inbox",
        "crm",
        "campaigns",
        "hub",
        "deployments",
    ]
)

# A SIGTERM must reach the process that runs a campaign or a reply: the stop flag is shared with the
# prefork pool children (made before they fork), and a child's SIGTERM marks it stopping, not dead.
from botmesh_admin.observability import shutdown  # noqa: E402

signals.worker_init.connect(shutdown.prepare_worker, weak=False)
signals.task_prerun.connect(shutdown.on_task_start, weak=False)
