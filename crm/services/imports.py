"""CRM writes: CSV imports (the job record, and running it row by row).

The CSV format itself (parsing and export) is ``crm.domain.csvio``. Logs carry
contact ids only, never phone numbers, emails or chat ids.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from botmesh_admin.errors import Conflict, NotFound, ValidationError, bounded
from botmesh_admin.events import default_journal
from botmesh_admin.events.base import EventRecord, StaleLeaseError
from botmesh_admin.events.services import event_publish
from botmesh_admin.events.worker import Claim
from botmesh_admin.kv.cas import CONTENDED_ATTEMPTS, cas_retry
from crm.domain import (
    Consent,
    Contact,
    IdentityTaken,
    ImportJob,
    csvio,
    new_id,
    normalize_tags,
    now_ms,
    validate_contact,
)
from crm.selectors import tenant_region
from crm.stores import default_store

from .contacts import _apply_suppressions, _mutate, _new_contact

log = logging.getLogger(__name__)

MAX_REPORTED_ERRORS = 1000
PROGRESS_EVERY_ROWS = 25
IMPORT_EVENT = "crm.import"
"""The journal event type of an import's run (payload ``{"job_id": <import id>}``)."""
IMPORT_CHANNEL = "crm-import"
"""Its journal channel (a channel id is ``[a-z0-9_-]``, so not ``crm.import``)."""


def contact_import_start(tenant: str, *, filename: str, data: bytes | str, created_by: str = "") -> ImportJob:
    """Record an import job with its CSV text (status ``queued``); the caller dispatches the task.

    Raise ``ValidationError`` (field ``file``) for an empty or oversized file.
    """
    text = csvio.decode(data)
    total = csvio.count_rows(text)
    at = now_ms()
    job = ImportJob(
        id=new_id("imp"),
        status="queued",
        filename=(filename or "upload.csv")[:200],
        total_rows=total,
        created_by=created_by[:150],
        created_at=at,
        updated_at=at,
    )
    return default_store().import_job_insert(tenant, job, text)


def _merge_row(tenant: str, row: csvio.ParsedRow, evidence: str) -> tuple[str, list[str], Contact | None]:
    """Create or merge the contact of one row; return ``("created"|"merged", notices, merged-into contact)``."""
    store = default_store()
    notices: list[str] = []

    def with_row(contact: Contact) -> Contact:
        notices.clear()
        contact = replace(
            contact,
            name=contact.name or row.name,
            identities=(*contact.identities, *(i for i in row.identities if i not in contact.identities)),
            tags=normalize_tags({*contact.tags, *row.tags}),
            attributes=dict(sorted({**contact.attributes, **row.attributes}.items())),
        )
        contact = _apply_suppressions(tenant, contact, row.identities)
        for channel, status in row.consent.items():
            current = contact.consent_status(channel)
            if current == status:
                continue
            if current == "denied" and status != "denied":
                # An opt-out is lifted only by the person's new opt-in, never by a file.
                notices.append(f"consent on {channel} stays denied: an import cannot lift an opt-out")
                continue
            contact = contact.with_consent(Consent(channel, status, now_ms(), "import", evidence))
        return contact

    def attempt() -> tuple[str, list[str], Contact | None]:
        owners = {c.id: c for i in row.identities if (c := store.contact_find(tenant, i)) is not None}
        if len(owners) > 1:
            raise ValidationError(
                "phone", "the row's identities belong to different contacts: " + ", ".join(sorted(owners))
            )
        if owners:
            (owner,) = owners.values()
            merged = _mutate(tenant, owner.id, with_row)
            return "merged", list(notices), merged
        contact = with_row(_new_contact(tenant, identities=(), name=None, source="import"))
        store.contact_insert(tenant, validate_contact(contact))
        return "created", list(notices), None

    # A concurrent writer claimed one of the identities or erased the owner: read again.
    return cas_retry(
        attempt,
        what="the row's contacts",
        attempts=CONTENDED_ATTEMPTS,
        retry_on=(IdentityTaken, NotFound),
        exhausted=lambda: Conflict("the row's contacts are changing too fast; try again"),  # kept in import reports
    )


def contact_import_queue(tenant: str, job_id: str) -> EventRecord:
    """Journal the run of import ``job_id``: event ``crm.import`` on channel ``crm-import``, payload ``{"job_id"}``.

    A drain of the channel runs it after the enclosing transaction commits (a
    Celery ``events.drain``, beat's safety net every 5 s, or a
    ``botmesh_events_worker --channel crm-import``), under the journal's fenced
    lease: its heartbeat keeps a live run's lease, a killed run's lease lapses
    and another worker resumes the job; a run that keeps failing is retried with
    backoff and then dead-lettered. Idempotent per job (key ``crm.import:<job id>``).
    """
    return event_publish(
        tenant,
        type=IMPORT_EVENT,
        channel=IMPORT_CHANNEL,
        payload={"job_id": job_id},
        idempotency_key=f"{IMPORT_EVENT}:{job_id}",
    )


def _held_elsewhere(job: ImportJob) -> bool:
    """Return True while a journal worker holds a live lease on the event running ``job``."""
    if job.status != "running" or not job.event_id:
        return False
    record = default_journal().get(job.event_id)
    return record is not None and record.state == "leased" and (record.leased_until or 0) > now_ms()


def contact_import_run(tenant: str, job_id: str, *, claim: Claim | None = None, will_retry: bool = False) -> ImportJob:
    """Run (or resume) an import job: every row is created or merged by identity.

    Bad rows are reported by row number and field, and the import keeps going.
    Progress is saved every few rows, so a job killed mid-run resumes after the
    last saved row (merging is idempotent by identity).

    ``claim`` is the journal claim of its ``crm.import`` event (the handler in
    ``crm.handlers`` passes it): every progress save first renews it
    (``Claim.check``), so a run whose lease another worker took over stops with
    ``StaleLeaseError`` and writes nothing more; a claimed run also resumes a
    ``failed`` job (the event was replayed from the dead-letter queue). Without
    a claim (a direct call) a finished job, or one whose event a worker holds,
    is returned as it is. When the run raises, the job is marked ``failed``
    unless ``will_retry`` (the journal has attempts left): then it stays
    ``running`` with a message saying it is retried.
    """
    store = default_store()
    found = store.import_job_get(tenant, job_id)
    if found is None:
        raise NotFound(f"import {bounded(str(job_id), 60)} not found")
    job = found
    if job.status == "done" or (claim is None and (job.finished or _held_elsewhere(job))):
        return job
    if claim is not None:
        claim.check()
    job = store.import_job_replace(
        tenant,
        replace(
            job,
            status="running",
            message=None,
            event_id=claim.event_id if claim is not None else job.event_id,
            updated_at=now_ms(),
        ),
        expected_version=job.version,
    )
    text = store.import_data_get(tenant, job_id)
    if text is None:
        return store.import_job_replace(
            tenant,
            replace(job, status="failed", message="the uploaded file is gone"),
            expected_version=job.version,
        )
    region = tenant_region(tenant)
    errors = list(job.errors)
    notices = list(job.notices)
    merges = list(job.merges)
    counts: dict[str, Any] = {
        "processed": job.processed,
        "created": job.created,
        "merged": job.merged,
        "failed_rows": job.failed_rows,
    }

    def save(**extra: Any) -> ImportJob:
        if claim is not None:
            claim.check()  # the lease is still ours (and renewed): else StaleLeaseError, nothing written
        return store.import_job_replace(
            tenant,
            replace(
                job,
                errors=tuple(errors[:MAX_REPORTED_ERRORS]),
                notices=tuple(notices[:MAX_REPORTED_ERRORS]),
                merges=tuple(merges[:MAX_REPORTED_ERRORS]),
                updated_at=now_ms(),
                **counts,
                **extra,
            ),
            expected_version=job.version,
        )

    try:
        header, rows = csvio.read_rows(text)  # a stored file that does not parse stops the run (and is retried)
        if not job.processed:
            errors += [e.to_json() for e in header.errors]
        for index, (number, cells) in enumerate(rows):
            if index < job.processed:
                continue
            parsed = csvio.parse_row(header, cells, number, region)
            if isinstance(parsed, list):
                errors += [e.to_json() for e in parsed]
                counts["failed_rows"] += 1
            else:
                try:
                    outcome, row_notices, into = _merge_row(tenant, parsed, f"CSV import {job.filename} row {number}")
                    counts[outcome] += 1
                    if into is not None:
                        merges.append({"row": number, "contact_id": into.id, "name": into.name})
                    notices += [{"row": number, "field": None, "message": n} for n in row_notices]
                except (ValidationError, Conflict) as exc:
                    errors.append(csvio.RowError(number, exc.field, getattr(exc, "problem", exc.message)).to_json())
                    counts["failed_rows"] += 1
            counts["processed"] = index + 1
            if counts["processed"] % PROGRESS_EVERY_ROWS == 0:
                job = save()
    except StaleLeaseError:
        log.warning("crm import lost its lease tenant=%s import=%s; another worker continues it", tenant, job_id)
        raise
    except Exception as exc:
        log.exception("crm import failed tenant=%s import=%s", tenant, job_id)
        if will_retry:
            save(message=f"the import stopped ({type(exc).__name__}); it is retried")
        else:
            save(status="failed", message=f"the import stopped: {type(exc).__name__}")
        raise
    job = save(status="done", total_rows=counts["processed"])
    store.import_data_delete(tenant, job_id)
    log.info(
        "crm import done tenant=%s import=%s created=%d merged=%d failed_rows=%d",
        tenant,
        job_id,
        job.created,
        job.merged,
        job.failed_rows,
    )
    return job


def contact_import_dead_lettered(tenant: str, job_id: str, *, event_id: str, error: str | None) -> ImportJob | None:
    """Mark import ``job_id`` ``failed`` because its ``crm.import`` event ``event_id`` was dead-lettered.

    The journal's dead-letter hook of ``crm.import`` (``crm.handlers``): the
    run's last attempt failed, or its worker died on it (its last lease
    expired). Without this the job would show ``running`` forever. The message
    says why (the journal's ``error``) and what to do (Replay on the journal
    page resumes the import after its last saved row). A job that is finished
    already, or that a newer event runs, is left as it is; an unknown job is
    ``None``. Compare-and-set: a progress save racing it is read again.
    """
    store = default_store()
    message = f"the import stopped for good: {error or 'its journal event was dead-lettered'}"
    message = f"{message[:400]} (replay its event on the journal page to resume it)"

    def attempt() -> ImportJob | None:
        job = store.import_job_get(tenant, job_id)
        if job is None or job.finished or (job.event_id and job.event_id != event_id):
            return job
        return store.import_job_replace(
            tenant, replace(job, status="failed", message=message, updated_at=now_ms()), expected_version=job.version
        )

    def version_miss(exc: BaseException) -> bool:
        return getattr(exc, "current_version", None) is not None

    job = cas_retry(attempt, what=f"import {job_id}", retry_on=Conflict, retry_if=version_miss)
    if job is not None and job.status == "failed":
        log.warning("crm import dead-lettered tenant=%s import=%s event=%s", tenant, job_id, event_id)
    return job
