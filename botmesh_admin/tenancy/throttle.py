"""Limit on failed logins, kept in the Kv so every web replica sees the same count.

After ``BOTMESH_LOGIN_MAX_FAILURES`` failed attempts for one user name, further
attempts are refused for ``BOTMESH_LOGIN_LOCKOUT_MS`` milliseconds counted from
the first failure. The key is a hash of the user name: no readable names in the Kv.
"""

from __future__ import annotations

import hashlib

from django.conf import settings

from botmesh_admin.clock import now_ms
from botmesh_admin.errors import Conflict
from botmesh_admin.kv import ABSENT, Delete, Put
from botmesh_admin.kv.cas import cas_retry
from botmesh_admin.kv.runtime import default_kv

TABLE = "system/login-failures"
FAILURE_ATTEMPTS = 20
"""Compare-and-set attempts on one name's failure count; running out counts as locked (8 locked a burst sooner).

Not the kernel's ``CONTENDED_ATTEMPTS`` though equal to it: exhausting this bound locks a login, so it is
a lockout setting that must not move when the package records' retry bound does."""


def _key(username: str) -> str:
    return hashlib.sha256(username.strip().lower().encode()).hexdigest()[:40]


def login_locked(username: str) -> bool:
    """Return True if ``username`` has reached the failure limit inside the window."""
    entry = default_kv().get(TABLE, _key(username))
    return bool(entry and entry.value >= settings.BOTMESH_LOGIN_MAX_FAILURES)


def login_failed(username: str) -> int:
    """Count one failed attempt (compare-and-set retry); return the count in the window."""
    kv, key = default_kv(), _key(username)

    def attempt() -> int:
        entry = kv.get(TABLE, key)
        if entry is None:
            kv.commit(TABLE, [Put(key, 1, ABSENT, ttl_ms=settings.BOTMESH_LOGIN_LOCKOUT_MS)])
            return 1
        remaining = max(1, (entry.expires_at or 0) - now_ms())
        kv.commit(TABLE, [Put(key, entry.value + 1, entry.version, ttl_ms=remaining)])
        return int(entry.value) + 1

    try:
        return cas_retry(attempt, what="the failed-login count", attempts=FAILURE_ATTEMPTS)
    except Conflict:  # a storm of failures for this name: count it as locked
        return int(settings.BOTMESH_LOGIN_MAX_FAILURES)


def login_succeeded(username: str) -> None:
    """Forget the failures of ``username``."""
    default_kv().commit(TABLE, [Delete(_key(username))])
