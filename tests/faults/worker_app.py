"""Celery app of the fault tests: botmesh_admin's app (its settings: late acks, prefetch 1) plus two tasks.

``celery -A tests.faults.worker_app worker``; the test sets ``CELERY_BROKER_URL``
and ``FAULTS_DIR`` (a test-only module, so it reads the latter itself). Each
task appends one line to ``<FAULTS_DIR>/started.log`` when it starts and to
``done.log`` when it ends, so the test counts runs, duplicates and losses.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "botmesh_admin.settings")
django.setup()

from botmesh_admin.celery import app  # noqa: E402

FAULTS_DIR = Path(os.environ["FAULTS_DIR"])
HOLD_LIMIT_S = 50.0  # a held task never outlives its test


def _line(name: str, text: str) -> None:
    with open(FAULTS_DIR / name, "a", encoding="utf-8") as out:  # one short append: atomic enough
        out.write(f"{text} {os.getpid()}\n")


@app.task(name="tests.faults.hold")
def hold(label: str) -> None:
    """Start, then block until the file ``<FAULTS_DIR>/release-<label>`` exists (an unacknowledged task)."""
    _line("started.log", label)
    deadline = time.monotonic() + HOLD_LIMIT_S
    while not (FAULTS_DIR / f"release-{label}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    _line("done.log", label)


@app.task(name="tests.faults.mark")
def mark(label: str) -> None:
    """Record that the worker ran this task."""
    _line("started.log", label)
    _line("done.log", label)
