"""Celery app of the frozen-holder proof: botmesh_admin's app on the embedded default, with the test tasks.

``celery -A tests.coordination.fenced_app worker -P solo``; the test gives it its
own data dir (SQLite Kv and journal, filesystem broker), so nothing is shared
with other tests.
"""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "botmesh_admin.settings")
django.setup()

from botmesh_admin.celery import app  # noqa: E402, F401 (what ``-A`` loads)
from tests.coordination import jobtasks  # noqa: E402, F401 (registers the tasks)
