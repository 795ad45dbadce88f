"""Settings for the test suite: the project's settings with test defaults in the environment.

Loaded by pytest-django (``DJANGO_SETTINGS_MODULE = tests.settings`` in pyproject)
before any conftest runs: each test process gets its own data dir, an
in-memory Kv and journal, and an in-memory Celery broker unless the
environment says otherwise (tests that start real workers pass their own).
"""

import os
import tempfile

os.environ.setdefault("BOTMESH_DATA_DIR", tempfile.mkdtemp(prefix="botmesh-test-"))
os.environ.setdefault("BOTMESH_KV_URL", "memory://")
os.environ.setdefault("BOTMESH_JOURNAL_URL", "memory://")
os.environ.setdefault("CELERY_BROKER_URL", "memory://")
# Playwright's sync API runs an event loop in the test thread; the ORM calls
# the tests make next to it are still synchronous.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
for _leak in ("DATABASE_URL", "REDIS_URL", "BOTMESH_PROFILE", "SECRET_KEY", "DEBUG"):
    os.environ.pop(_leak, None)

from botmesh_admin.settings import *  # noqa: E402,F403

# Fast password hashing: the tests log in a lot; production keeps Django's default.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# The suite's own coordinator (default_coordinator) is the in-process hub: no test process shares
# it with another, and a Kv coordinator would write every renewal into the test's Kv. Tests that
# coordinate processes build their coordinators by URL (tests/coordination); processes the tests
# start get the project's default from their own environment.
BOTMESH_COORDINATION_URL = "memory:"
