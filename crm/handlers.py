"""Journal consumers of the crm package (found by the events registry's autodiscovery).

- ``crm.import`` (channel ``crm-import``): run or resume one CSV import,
  ``payload = {"job_id": <import id>}`` (``crm.services.imports``); once
  dead-lettered, the import becomes ``failed`` with the reason.

The journal delivers at least once, with a fenced lease renewed by the
worker's heartbeat: the import resumes after its last saved row, and its
progress saves check the claim, so two workers never both write one job.
"""

from __future__ import annotations

from botmesh_admin.events.base import EventRecord
from botmesh_admin.events.handlers import register
from botmesh_admin.events.worker import current_claim

from .services.imports import IMPORT_EVENT


def import_dead_lettered(record: EventRecord) -> None:
    """The dead-letter hook of ``crm.import``: the import the record names becomes ``failed``, with the reason."""
    from .services import contact_import_dead_lettered

    job_id = record.payload.get("job_id") if isinstance(record.payload, dict) else None
    if isinstance(job_id, str):
        contact_import_dead_lettered(record.tenant, job_id, event_id=record.id, error=record.last_error)


@register(IMPORT_EVENT, on_dead_letter=import_dead_lettered)
def run_import(record: EventRecord) -> None:
    """Run the import the record names; raise (the journal retries, then dead-letters) if it stops.

    Raise ``ValueError`` for a payload without a ``job_id`` string (it dead-letters after its attempts).
    """
    from .services import contact_import_run

    job_id = record.payload.get("job_id") if isinstance(record.payload, dict) else None
    if not isinstance(job_id, str):
        raise ValueError("crm.import payload needs job_id (a string)")
    claim = current_claim()
    if claim is not None and (claim.event_id, claim.fencing_token) != (record.id, record.fencing_token):
        claim = None  # not the worker's claim of this record (a direct dispatch)
    will_retry = claim is not None and record.attempts < claim.journal.policy.max_attempts
    contact_import_run(record.tenant, job_id, claim=claim, will_retry=will_retry)
