"""Journal handlers of the coordination app (found by the events registry's autodiscovery)."""

from __future__ import annotations

from botmesh_admin.events.handlers import register

from .services import OCCURRENCE_TYPE, job_occurrence_run

register(OCCURRENCE_TYPE)(job_occurrence_run)
