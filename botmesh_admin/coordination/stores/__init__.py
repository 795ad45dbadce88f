"""Stores of the scheduled jobs' settings and scheduler state (see ``base.JobStore``)."""

from __future__ import annotations

from typing import Any

from .base import JobStore


def job_store() -> JobStore:
    """Return the JobStore over the configured Kv."""
    from botmesh_admin.kv.runtime import default_kv

    from .kv import KvJobStore

    return KvJobStore(default_kv())


def system_table(kv: Any) -> str:
    """Return the Kv table of the scheduler's own entries (presence, the file-locked leader), in ``kv``."""
    from botmesh_admin.kv import TenantKv

    from ..domain import SYSTEM_TENANT

    return TenantKv(kv, "coordination").reserved_table(SYSTEM_TENANT, "jobs")
