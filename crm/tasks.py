"""Celery tasks of the crm package: thin wrappers over services (STYLE §9).

CSV imports are not a Celery task: they run as the journal event ``crm.import``
(``crm.handlers``, queued by ``crm.services.contact_import_queue``).
"""

from __future__ import annotations

from celery import shared_task


@shared_task(bind=True, name="crm.segment_membership_build", acks_late=True, max_retries=10)
def segment_membership_build(self, tenant: str) -> int:  # type: ignore[no-untyped-def]
    """Build the membership of the tenant's new or changed segments; return the contacts read.

    Resumable: a killed run is continued by the next one (the pass's cursor is in the Kv).
    """
    from .services import segment_membership_build as build

    return build(tenant)


def dispatch_segment_build(tenant: str) -> None:
    """Queue the membership build if a segment waits for one (after a segment was saved, changed or deleted)."""
    from .selectors import segment_membership_pending

    if segment_membership_pending(tenant, sweep=True):
        segment_membership_build.delay(tenant)
