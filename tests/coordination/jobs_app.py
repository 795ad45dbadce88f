"""Celery app of the process proof: botmesh_admin's app, isolated, with one fast durable job.

``celery -A tests.coordination.jobs_app worker|beat``; configured by the test
through ``PROOF_*`` variables (a test-only module, so it reads them itself).
"""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "botmesh_admin.settings")
django.setup()

from django.conf import settings  # noqa: E402

from botmesh_admin.celery import app  # noqa: E402
from botmesh_admin.coordination.domain import JobSettings, JobSpec, Schedule  # noqa: E402
from botmesh_admin.coordination.registry import register_job  # noqa: E402
from tests.coordination import jobtasks  # noqa: E402, F401 (registers the tasks)

settings.BOTMESH_COORDINATION_PREFIX = os.environ["PROOF_PREFIX"]
settings.BOTMESH_COORDINATION_LEASE_MS = int(os.environ["PROOF_LEASE_MS"])
# The broker's key prefix isolates this proof from every other user of the test Redis (its
# queues keep the app's names, so the live/bulk/celery routing applies as in production).
app.conf.broker_transport_options = {"global_keyprefix": os.environ["PROOF_PREFIX"] + ":"}
app.conf.beat_schedule = {}

register_job(
    JobSpec(
        "proof",
        "tests.coordination.record_run",
        JobSettings(Schedule.interval(int(os.environ["PROOF_EVERY_S"])), catch_up="all"),
        pass_occurrence=True,
        lease_s=int(os.environ["PROOF_RUN_LEASE_S"]),
    )
)
