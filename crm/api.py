"""``/api/v1/tenants/{tenant}/contacts`` and ``/segments`` (ARCHITECTURE §11).

Reads, create, update and consent need the agent role; erasure, import,
export and segment writes need admin. Times are epoch milliseconds. Bad input
is 422 with the field path and writes nothing; a stale ``expected_version`` is
409 with ``current_version``.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, StreamingHttpResponse
from ninja import Field, Query, Router, Schema, Status

from botmesh_admin.api import BodyIn, CursorParams, ErrorOut, Page, one_of, principal, requires
from botmesh_admin.errors import DomainError, ValidationError

from . import selectors, services, tasks
from .domain import CHANNELS, CONSENT_STATUSES, Consent, Contact, ImportJob, Segment

router = Router(tags=["crm"])

ERRORS: dict[int, type[Schema]] = {403: ErrorOut, 404: ErrorOut, 409: ErrorOut, 422: ErrorOut}


class IdentityIO(Schema):
    channel: str = one_of(CHANNELS, description="whatsapp, telegram or email")
    address: str = Field(..., description="normalised on write: E.164, numeric id, lower-case email")


class ConsentOut(Schema):
    channel: str
    status: str
    at: int = Field(..., description="epoch milliseconds")
    source: str
    evidence: str | None = None


class ContactOut(Schema):
    id: str
    name: str | None
    identities: list[IdentityIO]
    tags: list[str]
    attributes: dict[str, Any]
    consent: dict[str, ConsentOut]
    consent_history: list[ConsentOut]
    source: str | None
    version: int
    created_at: int
    updated_at: int
    conversations_url: str


class ContactIn(BodyIn):
    identities: list[dict[str, Any]]
    name: str | None = None
    tags: list[Any] = []
    attributes: dict[str, Any] = {}
    consent: dict[str, Any] = {}


class ContactPatch(BodyIn):
    expected_version: int
    name: str | None = None
    identities: list[dict[str, Any]] | None = None
    tags: list[Any] | None = None
    add_tags: list[Any] = []
    remove_tags: list[Any] = []
    attributes: dict[str, Any] = {}
    remove_attributes: list[Any] = []


class ConsentIn(BodyIn):
    channel: str = one_of(CHANNELS)
    status: str = one_of(CONSENT_STATUSES)
    evidence: str | None = None
    source: str | None = Field(None, description="defaults to the caller (token or user)")


class ContactFilters(CursorParams):
    # A text search's cursor ("q" + base64url) outgrows the generic bound; it is URL-safe ASCII
    # (one byte of request line a character), so the list declares its shape instead (a value
    # of another shape says "not a cursor of this list": ``botmesh_admin.api._input_message``).
    after: str | None = Field(None, max_length=1401, pattern=r"^(c_[0-9a-f]{22}|q[A-Za-z0-9_-]{4,1400})$")
    tag: str | None = Field(None, max_length=64)
    q: str | None = Field(
        None,
        max_length=selectors.MAX_QUERY,
        description="words that start a name word, an email (or its words) or a phone number's digits",
    )
    identity: str | None = Field(None, max_length=300, description="<channel>:<address>")
    consent: str | None = Field(None, max_length=40, description="<channel>:<status>, e.g. whatsapp:granted")


class ErasureOut(Schema):
    contact_id: str
    erased: bool = True
    identities: int
    channels: list[str]
    tags: int
    attributes: int
    consent_records: int
    suppressed_channels: list[str] = Field(..., description="channels kept as hashed suppression entries")
    conversations: int = Field(0, description="inbox conversations linked to the contact, erased with it")


class RowReportOut(Schema):
    row: int
    field: str | None
    message: str


class RowMergeOut(Schema):
    row: int = Field(..., description="the row as a spreadsheet numbers it (the header is row 1)")
    contact_id: str
    name: str | None = Field(None, description="the contact's name after the merge")


class ImportJobOut(Schema):
    id: str
    status: str
    filename: str
    total_rows: int
    processed: int
    percent: int
    created: int
    merged: int
    failed_rows: int
    errors: list[RowReportOut]
    notices: list[RowReportOut]
    merges: list[RowMergeOut] = Field(..., description="rows merged into an existing contact, by row")
    message: str | None
    created_at: int
    updated_at: int


class RulesOut(Schema):
    tags_all: list[str]
    tags_any: list[str]
    tags_none: list[str]
    attributes: dict[str, Any]
    consent_required: str | None


class SegmentOut(Schema):
    id: str
    name: str
    rules: RulesOut
    version: int
    created_at: int
    updated_at: int
    count: int | None = None


class SegmentIn(BodyIn):
    name: str
    rules: dict[str, Any] = {}


class SegmentPatch(BodyIn):
    expected_version: int
    name: str | None = None
    rules: dict[str, Any] | None = None


class RulesIn(BodyIn):
    rules: dict[str, Any]


class CountOut(Schema):
    count: int


class PreviewOut(Schema):
    count: int
    items: list[ContactOut]


def _consent(c: Consent) -> dict[str, Any]:
    return {"channel": c.channel, "status": c.status, "at": c.at, "source": c.source, "evidence": c.evidence}


def contact_out(tenant: str, c: Contact) -> dict[str, Any]:
    """Return the API shape of a contact."""
    return {
        "id": c.id,
        "name": c.name,
        "identities": [{"channel": i.channel, "address": i.address} for i in c.identities],
        "tags": list(c.tags),
        "attributes": dict(c.attributes),
        "consent": {ch: _consent(v) for ch, v in c.consent.items()},
        "consent_history": [_consent(v) for v in c.consent_history],
        "source": c.source,
        "version": c.version,
        "created_at": c.created_at,
        "updated_at": c.updated_at,
        "conversations_url": f"/t/{tenant}/inbox/?contact={c.id}",
    }


def job_out(job: ImportJob) -> dict[str, Any]:
    """Return the API shape of an import job."""
    return {
        "id": job.id,
        "status": job.status,
        "filename": job.filename,
        "total_rows": job.total_rows,
        "processed": job.processed,
        "percent": job.percent,
        "created": job.created,
        "merged": job.merged,
        "failed_rows": job.failed_rows,
        "errors": list(job.errors),
        "notices": list(job.notices),
        "merges": list(job.merges),
        "message": job.message,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
    }


def segment_out(s: Segment, count: int | None = None) -> dict[str, Any]:
    """Return the API shape of a segment."""
    return {
        "id": s.id,
        "name": s.name,
        "rules": s.rules.to_json(),
        "version": s.version,
        "created_at": s.created_at,
        "updated_at": s.updated_at,
        "count": count,
    }


# --------------------------------------------------------------------------- contacts


@router.get("contacts", response={200: Page[ContactOut], **ERRORS})
@requires("agent")
def contact_list(request: HttpRequest, tenant: str, filters: Query[ContactFilters]) -> dict[str, Any]:
    """List contacts by id (creation time); filter by ``tag``, ``consent``, text ``q`` or ``identity``.

    A text search may list by matching word instead; a filtered page may be
    short (even empty) with a ``next``: follow ``next`` until it is null.
    """
    page = selectors.contact_list(
        tenant,
        limit=filters.limit,
        after=filters.after,
        tag=filters.tag,
        q=filters.q,
        identity=filters.identity,
        consent=filters.consent,
    )
    return {"items": [contact_out(tenant, c) for c in page.items], "next": page.next}


@router.post("contacts", response={201: ContactOut, **ERRORS})
@requires("agent")
def contact_create(request: HttpRequest, tenant: str, body: ContactIn) -> Status:
    """Create a contact; 409 ``identity_taken`` (with ``contact_id``) if an identity has an owner."""
    p = principal(request)
    contact = services.contact_create(
        tenant,
        identities=body.identities,
        name=body.name,
        tags=body.tags,
        attributes=body.attributes,
        consent=body.consent,
        source=p.actor,
    )
    return Status(201, contact_out(tenant, contact))


@router.get("contacts/export", response={200: None, **ERRORS})
@requires("admin")
def contact_export(request: HttpRequest, tenant: str) -> StreamingHttpResponse:
    """Download every contact as CSV (admins); the file imports back to the same contacts."""
    response = StreamingHttpResponse(selectors.contact_export_csv(tenant), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="contacts-{tenant}.csv"'
    return response


IMPORT_BODY = {
    "requestBody": {
        "required": True,
        "description": "the CSV: a multipart upload whose field is named ``file``, or the raw CSV "
        "(``text/csv``, name it with ``X-Filename``; at most DATA_UPLOAD_MAX_MEMORY_SIZE)",
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {"file": {"type": "string", "format": "binary"}},
                },
            },
            "text/csv": {"schema": {"type": "string"}},
        },
    }
}


IMPORT_CONTENT_TYPES = ("multipart/form-data", "text/csv")  # the two bodies IMPORT_BODY documents


class UnsupportedMediaType(DomainError):
    """The request body has a content type the endpoint does not read (RFC 9110 §15.5.16). HTTP 415."""

    code = "unsupported_media_type"
    status = 415


def _import_upload(request: HttpRequest) -> tuple[str, bytes]:
    """Return (filename, bytes) of the CSV an import request carries.

    A ``multipart/form-data`` body must hold the CSV in the field ``file``
    (422 ``file`` otherwise, naming the fields it had); one without a boundary,
    or with more than ``DATA_UPLOAD_MAX_NUMBER_FILES`` files, is 400 (raised by
    Django's parser, rendered by ``botmesh_admin.api``). A ``text/csv`` body is
    the raw CSV. Any other content type (JSON, a form, none) is 415
    ``UnsupportedMediaType`` on ``file`` naming the two accepted bodies, the ones
    ``IMPORT_BODY`` documents. The multipart parser consumes the request stream,
    so the raw body is never read after it.
    """
    content_type = (request.content_type or "").lower()
    if not content_type and request.META.get("CONTENT_LENGTH") in (None, "", "0"):
        content_type = "text/csv"  # no body at all has no type to refuse: it is the empty file (422)
    if content_type not in IMPORT_CONTENT_TYPES:
        sent = content_type[:80] or "no Content-Type"
        raise UnsupportedMediaType(
            f"file: send the CSV as multipart/form-data with the field 'file', or as a text/csv body (got {sent})",
            field="file",
        )
    if content_type == "text/csv":
        try:
            data = request.body
        except RequestDataTooBig:
            raise ValidationError(
                "file", "a raw CSV body is limited by DATA_UPLOAD_MAX_MEMORY_SIZE; send a multipart field 'file'"
            ) from None
        return request.headers.get("X-Filename", "upload.csv"), data
    files = request.FILES  # MultiPartParserError / TooManyFilesSent: JSON 400 from the API's handlers
    uploads = files.getlist("file")
    if not uploads:
        sent = sorted({*files.keys(), *request.POST.keys()})
        got = f"got {', '.join(repr(name[:40]) for name in sent[:5])}" if sent else "got no field"
        raise ValidationError("file", f"is required: send the CSV as the multipart field 'file' ({got})")
    if len(uploads) > 1:
        raise ValidationError("file", f"one CSV per import ({len(uploads)} files were sent)")
    return uploads[0].name or "upload.csv", uploads[0].read()


@router.post("contacts/imports", response={202: ImportJobOut, **ERRORS, 415: ErrorOut}, openapi_extra=IMPORT_BODY)
@requires("admin")
def contact_import(request: HttpRequest, tenant: str) -> Status:
    """Start a CSV import (admins): a multipart ``file`` or the raw CSV body (``text/csv``).

    Answers 202 with the job; poll ``GET contacts/imports/{id}`` for progress and the report.
    A malformed upload is 400 (unreadable multipart) or 422 ``file`` (no such field, a file that is
    not text in an accepted encoding), another content type 415 ``file``; never a 500.
    """
    p = principal(request)
    filename, data = _import_upload(request)
    job = services.contact_import_start(tenant, filename=filename, data=data, created_by=p.actor)
    services.contact_import_queue(tenant, job.id)
    return Status(202, job_out(selectors.import_job_get(tenant, job.id)))


@router.get("contacts/imports", response={200: list[ImportJobOut], **ERRORS})
@requires("agent")
def contact_import_list(request: HttpRequest, tenant: str) -> list[dict[str, Any]]:
    """The 20 most recent imports, newest first."""
    return [job_out(j) for j in selectors.import_job_list(tenant)]


@router.get("contacts/imports/{job_id}", response={200: ImportJobOut, **ERRORS})
@requires("agent")
def contact_import_get(request: HttpRequest, tenant: str, job_id: str) -> dict[str, Any]:
    """An import's progress and its report (bad rows by row number and field)."""
    return job_out(selectors.import_job_get(tenant, job_id))


@router.get("contacts/{contact_id}", response={200: ContactOut, **ERRORS})
@requires("agent")
def contact_get(request: HttpRequest, tenant: str, contact_id: str) -> dict[str, Any]:
    """One contact with identities, tags, attributes and consent history."""
    return contact_out(tenant, selectors.contact_get(tenant, contact_id))


@router.patch("contacts/{contact_id}", response={200: ContactOut, **ERRORS})
@requires("agent")
def contact_update(request: HttpRequest, tenant: str, contact_id: str, body: ContactPatch) -> dict[str, Any]:
    """Change a contact at ``expected_version``; 409 with ``current_version`` when stale.

    ``identities``/``tags`` replace; ``add_tags``/``remove_tags`` edit; ``attributes``
    merge (null is a value); ``remove_attributes`` deletes.
    """
    sent = body.model_fields_set
    kwargs: dict[str, Any] = {}
    if "name" in sent:
        kwargs["name"] = body.name
    if "identities" in sent and body.identities is not None:
        kwargs["identities"] = body.identities
    if "tags" in sent and body.tags is not None:
        kwargs["tags"] = body.tags
    contact = services.contact_update(
        tenant,
        contact_id,
        expected_version=body.expected_version,
        add_tags=body.add_tags,
        remove_tags=body.remove_tags,
        attributes=body.attributes,
        remove_attributes=body.remove_attributes,
        **kwargs,
    )
    return contact_out(tenant, contact)


@router.post("contacts/{contact_id}/consent", response={200: ContactOut, **ERRORS})
@requires("agent")
def consent_set(request: HttpRequest, tenant: str, contact_id: str, body: ConsentIn) -> dict[str, Any]:
    """Record marketing consent on one channel (kept alongside concurrent changes)."""
    contact = services.consent_set(
        tenant,
        contact_id,
        channel=body.channel,
        status=body.status,
        source=body.source or principal(request).actor,
        evidence=body.evidence,
    )
    return contact_out(tenant, contact)


@router.delete("contacts/{contact_id}", response={200: ErasureOut, **ERRORS})
@requires("admin")
def contact_erase(request: HttpRequest, tenant: str, contact_id: str) -> dict[str, Any]:
    """Erase a contact (admins): identities, tags, attributes, consent history, its conversations. Reports what went."""
    report = services.contact_erase(tenant, contact_id)
    return {
        **report.__dict__,
        "channels": list(report.channels),
        "suppressed_channels": list(report.suppressed_channels),
    }


# --------------------------------------------------------------------------- segments


@router.get("segments", response={200: list[SegmentOut], **ERRORS})
@requires("agent")
def segment_list(request: HttpRequest, tenant: str, counts: bool = False) -> list[dict[str, Any]]:
    """Saved segments; ``counts=true`` adds each live count (one pass over the contacts)."""
    segments = selectors.segment_list(tenant)
    live = selectors.segment_counts(tenant, segments) if counts else {}
    return [segment_out(s, live.get(s.id)) for s in segments]


@router.post("segments", response={201: SegmentOut, **ERRORS})
@requires("admin")
def segment_create(request: HttpRequest, tenant: str, body: SegmentIn) -> Status:
    """Save a segment (admins). Rules: tags_all, tags_any, tags_none, attributes, consent_required."""
    segment = services.segment_create(tenant, name=body.name, rules=body.rules)
    tasks.dispatch_segment_build(tenant)
    return Status(201, segment_out(segment))


@router.post("segments/preview", response={200: PreviewOut, **ERRORS})
@requires("agent")
def segment_preview_rules(
    request: HttpRequest, tenant: str, body: RulesIn, limit: int = Query(20, ge=0, le=200)
) -> dict[str, Any]:
    """Live count and first members of unsaved rules (for editing a segment)."""
    preview = selectors.segment_preview(tenant, body.rules, limit=limit)
    return {"count": preview.count, "items": [contact_out(tenant, c) for c in preview.sample]}


@router.get("segments/{segment_id}", response={200: SegmentOut, **ERRORS})
@requires("agent")
def segment_get(request: HttpRequest, tenant: str, segment_id: str) -> dict[str, Any]:
    """One segment, with its live count (``count``: what ``/count`` and the segments page say)."""
    segment = selectors.segment_get(tenant, segment_id)
    return segment_out(segment, selectors.segment_counts(tenant, [segment])[segment.id])


@router.patch("segments/{segment_id}", response={200: SegmentOut, **ERRORS})
@requires("admin")
def segment_update(request: HttpRequest, tenant: str, segment_id: str, body: SegmentPatch) -> dict[str, Any]:
    """Rename or change the rules at ``expected_version`` (admins); 409 when stale."""
    segment = services.segment_update(
        tenant, segment_id, expected_version=body.expected_version, name=body.name, rules=body.rules
    )
    tasks.dispatch_segment_build(tenant)
    return segment_out(segment)


@router.delete("segments/{segment_id}", response={204: None, **ERRORS})
@requires("admin")
def segment_delete(request: HttpRequest, tenant: str, segment_id: str) -> Status:
    """Delete a segment (admins)."""
    services.segment_delete(tenant, segment_id)
    tasks.dispatch_segment_build(tenant)
    return Status(204, None)


@router.get("segments/{segment_id}/count", response={200: CountOut, **ERRORS})
@requires("agent")
def segment_count(request: HttpRequest, tenant: str, segment_id: str) -> dict[str, int]:
    """How many contacts match now."""
    return {"count": selectors.segment_count(tenant, segment_id)}


@router.get("segments/{segment_id}/preview", response={200: PreviewOut, **ERRORS})
@requires("agent")
def segment_preview(
    request: HttpRequest, tenant: str, segment_id: str, limit: int = Query(20, ge=0, le=200)
) -> dict[str, Any]:
    """Live count and the first ``limit`` members."""
    preview = selectors.segment_preview(tenant, segment_id, limit=limit)
    return {"count": preview.count, "items": [contact_out(tenant, c) for c in preview.sample]}
