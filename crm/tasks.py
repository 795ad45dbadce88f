"""Celery tasks of the crm package: thin wrappers over services (STYLE §9)."""

from __future__ import annotations

from celery import shared_task

from . import services

BUSY_RETRY_S = 60


@shared_task(bind=True, name="crm.contact_import", acks_late=True, max_retries=10)
def contact_import(self, tenant: str, job_id: str) -> str:  # type: ignore[no-untyped-def]
    """Run (or resume) the CSV import ``job_id`` of ``tenant``; return its final status.

    If another worker holds the job (it saved progress recently), come back
    later: when that worker died, the job goes stale and this run resumes it.
    """
    job = services.contact_import_run(tenant, job_id)
    if job.status == "running":
        raise self.retry(countdown=BUSY_RETRY_S)
    return job.status


def dispatch_import(tenant: str, job_id: str) -> None:
    """Queue the import task (after the job record was committed to the Kv)."""
    contact_import.delay(tenant, job_id)


@shared_task(bind=True, name="crm.segment_membership_build", acks_late=True, max_retries=10)
def segment_membership_build(self, tenant: str) -> int:  # type: ignore[no-untyped-def]
    """Build the membership of the tenant's new or changed segments; return the contacts read.

    Resumable: a killed run is continued by the next one (the pass's cursor is in the Kv).
    """
    return services.segment_membership_build(tenant)


def dispatch_segment_build(tenant: str) -> None:
    """Queue the membership build if a segment waits for one (after a segment was saved, changed or deleted)."""
    from .selectors import segment_membership_pending

    if segment_membership_pending(tenant, sweep=True):
        segment_membership_build.delay(tenant)
