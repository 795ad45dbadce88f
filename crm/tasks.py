"""Celery tasks of the crm package: thin wrappers over services (STYLE §9)."""

from __future__ import annotations

import logging

from celery import shared_task

from . import services

log = logging.getLogger(__name__)


@shared_task(name="crm.contact_import", acks_late=True, max_retries=3, default_retry_delay=10)
def contact_import(tenant: str, job_id: str) -> str:
    """Run (or resume) the CSV import ``job_id`` of ``tenant``; return its final status."""
    return services.contact_import_run(tenant, job_id).status


def dispatch_import(tenant: str, job_id: str) -> None:
    """Queue the import task (after the job record was committed to the Kv)."""
    contact_import.delay(tenant, job_id)
