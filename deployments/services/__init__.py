"""Writes of deployments: publish, gate runs, activate, rollback, prune (ARCHITECTURE §5).

``versions`` holds versions and the active pointer; ``gates`` the gate runs and decisions.
``from deployments.services import <action>`` is the public surface.
"""

from __future__ import annotations

from .gates import DECISION_LEASE_MS, DEFAULT_LEASE_MS, MAX_LEASE_MS, gate_decide, gate_run_finish, gate_run_start
from .versions import deployment_activate, deployment_rollback, retain_versions, version_prune, version_publish

__all__ = [
    "DECISION_LEASE_MS",
    "DEFAULT_LEASE_MS",
    "MAX_LEASE_MS",
    "deployment_activate",
    "deployment_rollback",
    "gate_decide",
    "gate_run_finish",
    "gate_run_start",
    "retain_versions",
    "version_prune",
    "version_publish",
]
