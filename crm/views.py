"""CRM admin pages: contacts (search, tag filter, detail), CSV import with progress, segments.

Pages read without JavaScript; htmx adds live search, import progress polling
and segment previews. Views call services and selectors only.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_POST

from botmesh_admin import confirmation
from botmesh_admin.errors import Conflict, DomainError, ValidationError
from botmesh_admin.formerrors import FormError, check_all, error_text, form_error
from botmesh_admin.jsonbody import json_load
from botmesh_admin.tenancy.decorators import page_principal, render_error, tenant_page
from botmesh_admin.validation import CONTROL_RE, ascii_digits

from . import selectors, services, tasks
from .domain import CHANNELS, CONSENT_STATUSES, normalize_identities, validate_attributes, validate_name
from .selectors import tenant_region

MAX_TRAIL = 50  # earlier pages a contacts link remembers for "Previous" (past that, "First page")


def _is_htmx(request: HttpRequest) -> bool:
    return bool(request.headers.get("HX-Request"))


def _render(request: HttpRequest, page: str, fragment: str, context: dict[str, Any], status: int = 200) -> HttpResponse:
    """Render the full page, or only the fragment for htmx; caches keep the two apart."""
    response = render(request, fragment if _is_htmx(request) else page, context, status=status)
    patch_vary_headers(response, ("HX-Request",))
    return response


# --------------------------------------------------------------------------- contacts


@tenant_page("agent")
def contacts(request: HttpRequest, tenant: str) -> HttpResponse:
    """The contact list with text search and a tag filter (cursor pages of 50)."""
    q = request.GET.get("q", "").strip()
    tag = request.GET.get("tag", "").strip()
    after = request.GET.get("after") or None
    error = None
    # Cursors only go forward: the way back is the cursors of the pages before, carried in the links (?prev=…).
    trail = request.GET.getlist("prev")[-MAX_TRAIL:]
    try:
        for earlier in trail:  # "" is the first page; anything else must be a cursor this list made
            if earlier and not selectors.CONTACT_CURSOR.fullmatch(earlier):
                raise ValidationError("prev", "not a cursor of this list (follow the page's Previous and Next links)")
        page = selectors.contact_list(tenant, limit=50, after=after, tag=tag or None, q=q or None)
    except DomainError as exc:
        page, error, trail = selectors.ContactPage([], None), exc.message, []
        q = CONTROL_RE.sub("", q)[: selectors.MAX_QUERY]  # echoed in the search box: no NUL, not 5,000 characters
    filters = {k: v for k, v in (("q", q), ("tag", tag)) if v}
    context = {
        "tenant": tenant,
        "page": page,
        "q": q,
        "tag": tag,
        "error": error,
        "is_admin": page_principal(request).can("admin"),
        "total": selectors.contact_count(tenant),  # one counter read
        **_pager(filters, after=after, trail=trail, next_cursor=page.next),
    }
    response = _render(request, "crm/contacts.html", "crm/_contact_rows.html", context)
    if error is not None and not _is_htmx(request):
        # The page shows the error above an empty list; a 400 so a link checker or a
        # script sees the address was bad. htmx (search as you type) keeps 200: it
        # swaps only 2xx answers, and the row fragment shows the error in place.
        response.status_code = 400
    return response


def _pager(filters: dict[str, str], *, after: str | None, trail: list[str], next_cursor: str | None) -> dict[str, Any]:
    """Return the page number and the query strings of the previous and next pages of the contacts list.

    ``trail`` holds the ``after`` of every earlier page ("" for the first), so
    "Previous" pops one; a list opened at a cursor without it goes back to the
    first page. ``page_number`` is None when it is not known.
    """
    nxt = prev = None
    if next_cursor:
        nxt = urlencode({**filters, "after": next_cursor, "prev": [*trail, after or ""]}, doseq=True)
    if after:
        back = trail[-1] if trail else ""
        prev = urlencode({**filters, **({"after": back} if back else {}), "prev": trail[:-1]}, doseq=True)
    number = 1 if not after else (len(trail) + 1 if trail else None)
    return {"page_number": number, "next_query": nxt, "prev_query": prev}


@tenant_page("agent")
def contact_detail(request: HttpRequest, tenant: str, contact_id: str) -> HttpResponse:
    """One contact: identities, tags, attributes, consent and its history, link to conversations; the edit form."""
    return _contact_page(request, tenant, contact_id)


def _contact_page(request: HttpRequest, tenant: str, contact_id: str, **extra: Any) -> HttpResponse:
    contact = selectors.contact_get(tenant, contact_id)
    status = extra.pop("status", 200)
    return render(
        request,
        "crm/contact.html",
        {
            "tenant": tenant,
            "contact": contact,
            "channels": CHANNELS,
            "statuses": CONSENT_STATUSES,
            "consent_rows": [(ch, contact.consent.get(ch)) for ch in CHANNELS],
            "history": list(reversed(contact.consent_history)),
            "is_admin": page_principal(request).can("admin"),
            "edit": edit_form_of(contact),
            **extra,
        },
        status=status,
    )


EDIT_FIELDS = {
    "contact.name": "name",
    "contact.identities": "identities",
    "identities": "identities",
    "contact.attributes": "attributes",
    "attributes": "attributes",
    "version": "version",
}
EDIT_LINES = ("identities", "attributes")
"""The edit form's text areas, one entry a line: an error names the line (``Line 2: …``)."""


def edit_form_of(contact: Any) -> dict[str, str]:
    """Return the edit form's text of ``contact``: identities one ``channel address`` a line, attributes
    one ``name = JSON value`` a line (so ``"1"`` text and ``1`` number stay apart)."""
    return {
        "name": contact.name or "",
        "identities": "\n".join(f"{i.channel} {i.address}" for i in contact.identities),
        "attributes": "\n".join(f"{k} = {json.dumps(v, ensure_ascii=False)}" for k, v in contact.attributes.items()),
    }


def _lines(text: str) -> list[tuple[int, str]]:
    """Return the non-blank lines of ``text`` with their index (0-based) among all its lines."""
    return [(i, line) for i, line in enumerate(text.splitlines()) if line.strip()]


def _on_line(field: str, index: int, check: Any) -> Any:
    """Return a check of one line: ``check()``, its ``ValidationError`` moved to ``<field>[index]``.

    The domain names the value it got (``contact.identities[0].address``, ``contact.attributes.plan``);
    the form names the line it was typed on (``identities[1].address``, ``attributes[1].plan``).
    """

    def run() -> Any:
        try:
            return check()
        except ValidationError as exc:
            rest = (exc.field or "").removeprefix("contact.")
            rest = rest.removeprefix(field)
            rest = rest[rest.index("]") + 1 :] if rest.startswith("[") else rest
            raise ValidationError(f"{field}[{index}]{rest}", exc.problem) from None

    return run


def _identity_line(line: str, region: str) -> dict[str, str]:
    """Read one ``channel address`` line and check it as the contact's would be (``crm.domain``)."""
    channel, _, address = line.strip().partition(" ")
    if not address.strip():
        raise ValidationError("identities", "write the channel, a space, then the address (whatsapp +57…)")
    typed = {"channel": channel.strip().lower(), "address": address.strip()}
    normalize_identities([typed], region)
    return typed


def _attribute_line(line: str) -> tuple[str, Any]:
    """Read one ``name = value`` line; a value that is not JSON (``Bogotá``) is text. Checked as stored."""
    name, eq, raw = line.partition("=")
    if not eq or not name.strip():
        raise ValidationError("attributes", "write the name, '=', then the value (plan = \"gold\")")
    raw = raw.strip()
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    validate_attributes({name.strip(): value})
    return name.strip(), value


def _edit_typed(tenant: str, typed: Any) -> tuple[int, list[dict[str, str]], dict[str, Any]]:
    """Return (version, identities, attributes) of the edit form, or refuse every bad line and field at once.

    Raise ``formerrors.FieldErrors``: the version, the name, each identity line (``identities[1]``) and each
    attribute line (``attributes[2]``) checked as ``services.contact_update`` would, all reported together.
    """
    raw = typed.get("version", "")
    region = tenant_region(tenant)
    identities: list[dict[str, str]] = []
    attributes: dict[str, Any] = {}

    def version() -> None:
        if not ascii_digits(raw, max_digits=20):
            raise ValidationError("version", "reload the page: the form lost its version")

    checks: list[Any] = [version, lambda: validate_name(typed.get("name", ""))]
    for i, line in _lines(typed.get("identities", "")):
        checks.append(_on_line("identities", i, lambda line=line: identities.append(_identity_line(line, region))))
    for i, line in _lines(typed.get("attributes", "")):
        checks.append(_on_line("attributes", i, lambda line=line: attributes.update([_attribute_line(line)])))
    check_all(*checks)
    return int(raw), identities, attributes


@require_POST
@tenant_page("agent")
def contact_edit(request: HttpRequest, tenant: str, contact_id: str) -> HttpResponse:
    """Change name, identities and attributes at the version the form showed (``services.contact_update``).

    A stale version (someone changed the contact since) is refused with a
    409 page that shows their change and keeps what was typed; bad fields and
    lines are a 422 naming every one at once under its input (``_edit_typed``). Either way nothing is written.
    """
    typed = request.POST
    try:
        current = selectors.contact_get(tenant, contact_id)
        version, identities, attributes = _edit_typed(tenant, typed)
        services.contact_update(
            tenant,
            contact_id,
            expected_version=version,
            name=typed.get("name", "").strip() or None,
            identities=identities,
            attributes=attributes,
            remove_attributes=[k for k in current.attributes if k not in attributes],
        )
    except DomainError as exc:
        if exc.status == 404:
            return render_error(request, exc)
        if isinstance(exc, Conflict) and exc.current_version is not None and exc.code == "conflict":
            refused = FormError(
                "edit",
                None,
                f"Someone changed this contact since you opened it (version {typed.get('version')}, now"
                f" {exc.current_version}): nothing was saved. Their change is shown above; your edit is kept below"
                " — save it again to replace theirs.",
                {k: v for k, v in typed.items() if isinstance(v, str)},
                409,
            )
        else:
            refused = form_error(exc, form="edit", fields=EDIT_FIELDS, typed=typed, lines=EDIT_LINES)
        return _contact_page(request, tenant, contact_id, form_error=refused, status=refused.status)
    messages.success(request, "Contact saved.")
    return redirect("crm:contact", tenant=tenant, contact_id=contact_id)


@require_POST
@tenant_page("agent")
def contact_tags(request: HttpRequest, tenant: str, contact_id: str) -> HttpResponse:
    """Add or remove one tag (compare-and-set retry, so concurrent edits are kept).

    ``action``: ``add`` (the default: the add form sends none) or ``remove``; any other is a 422, nothing changed.
    """
    tag = request.POST.get("tag", "")
    action = request.POST.get("action", "add")
    try:
        if action == "remove":
            services.contact_tags_remove(tenant, contact_id, tags=[tag])
        elif action == "add":
            services.contact_tags_add(tenant, contact_id, tags=[tag])
        else:
            raise ValidationError("action", "unknown action: the tag buttons add or remove")
    except ValidationError as exc:
        if action == "remove":
            messages.error(request, error_text(exc))
        else:  # the tag typed stays in its box, the problem under it
            refused = form_error(exc, form="tag", fields={"tags[0]": "tag", "action": "tag"}, typed=request.POST)
            return _contact_page(request, tenant, contact_id, form_error=refused, status=refused.status)
    return redirect("crm:contact", tenant=tenant, contact_id=contact_id)


@require_POST
@tenant_page("agent")
def contact_consent(request: HttpRequest, tenant: str, contact_id: str) -> HttpResponse:
    """Record a consent change made by the signed-in user."""
    try:
        services.consent_set(
            tenant,
            contact_id,
            channel=request.POST.get("channel", ""),
            status=request.POST.get("status", ""),
            source=page_principal(request).actor,
            evidence=request.POST.get("evidence", "").strip() or None,
        )
        messages.success(request, "Consent recorded.")
    except ValidationError as exc:
        refused = form_error(exc, form="consent", fields=CONSENT_FIELDS, typed=request.POST)
        return _contact_page(request, tenant, contact_id, form_error=refused, status=refused.status)
    return redirect("crm:contact", tenant=tenant, contact_id=contact_id)


CONSENT_FIELDS = {"consent.channel": "channel", "consent.status": "status", "consent.evidence": "evidence"}
"""The consent form's inputs by the domain field path a refusal names (``botmesh_admin.formerrors``)."""


@tenant_page("admin")
def contact_erase(request: HttpRequest, tenant: str, contact_id: str) -> HttpResponse:
    """Erase a contact once confirmed (``botmesh_admin.confirmation``) and say what was removed."""
    if not confirmation.confirmed(request):
        contact = selectors.contact_get(tenant, contact_id)
        return confirmation.confirm_page(
            request,
            question=f"Erase the contact {contact.name or contact.id!r} for good?",
            consequences=[
                "Right to erasure: its identities, tags, attributes and consent history are deleted and cannot be"
                " brought back, and so are its inbox conversations (messages, notes). A denied consent survives"
                " only as a hashed suppression entry, so the person is never messaged again by mistake."
            ],
            button="Erase the contact",
            cancel_url=reverse("crm:contact", kwargs={"tenant": tenant, "contact_id": contact_id}),
        )
    report = services.contact_erase(tenant, contact_id)
    kept = (
        f"; kept a hashed suppression entry for {', '.join(report.suppressed_channels)}"
        if report.suppressed_channels
        else ""
    )
    messages.success(
        request,
        f"Contact {report.contact_id} erased: {report.identities} identities, {report.tags} tags, "
        f"{report.attributes} attributes, {report.consent_records} consent records, "
        f"{report.conversations} conversation{'' if report.conversations == 1 else 's'}{kept}.",
    )
    return confirmation.done(request, reverse("crm:contacts", kwargs={"tenant": tenant}))


# --------------------------------------------------------------------------- import / export


@tenant_page("admin")
def contact_import(request: HttpRequest, tenant: str) -> HttpResponse:
    """Upload a CSV (the import runs as a journal event, ``crm.import``) and list recent imports."""
    if request.method == "POST":
        upload = request.FILES.get("file")
        try:
            if upload is None:
                raise ValidationError("file", "choose a CSV file")
            job = services.contact_import_start(
                tenant, filename=upload.name, data=upload.read(), created_by=page_principal(request).actor
            )
        except ValidationError as exc:
            # The error under the file input, 422 (a browser never refills a file input: choose it again).
            refused = form_error(exc, form="import", fields={"file": "file", "import.file": "file"})
            context = {"tenant": tenant, "jobs": selectors.import_job_list(tenant), "form_error": refused}
            return render(request, "crm/import.html", context, status=exc.status)
        services.contact_import_queue(tenant, job.id)
        return redirect("crm:import-job", tenant=tenant, job_id=job.id)
    return render(request, "crm/import.html", {"tenant": tenant, "jobs": selectors.import_job_list(tenant)})


@tenant_page("admin")
def import_job(request: HttpRequest, tenant: str, job_id: str) -> HttpResponse:
    """An import's progress (htmx polls ``_import_progress.html`` until it is done) and report."""
    job = selectors.import_job_get(tenant, job_id)
    return _render(request, "crm/import_job.html", "crm/_import_progress.html", {"tenant": tenant, "job": job})


@tenant_page("admin")
def contact_export(request: HttpRequest, tenant: str) -> StreamingHttpResponse:
    """Download every contact as CSV."""
    response = StreamingHttpResponse(selectors.contact_export_csv(tenant), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="contacts-{tenant}.csv"'
    return response


# --------------------------------------------------------------------------- segments


def _split(text: str) -> list[str]:
    return [t.strip() for t in text.replace(";", ",").split(",") if t.strip()]


def rules_from_form(data: Any) -> dict[str, Any]:
    """Return segment rules from the form: comma-separated tags, ``name = value`` attribute lines.

    An attribute value is read as JSON (``1``, ``true``, ``null``, ``"1"``) and,
    when it is not JSON, as text — so ``plan = pro`` is the string ``"pro"``
    while ``plan = 1`` is the number 1 and ``plan = "1"`` the string.
    """
    attributes: dict[str, Any] = {}
    for number, line in enumerate(data.get("attributes", "").splitlines(), start=1):
        if not line.strip():
            continue
        name, sep, raw = line.partition("=")
        if not sep:
            raise ValidationError("segment.rules.attributes", f"line {number}: write name = value")
        try:
            value = json_load(raw.strip(), field="segment.rules.attributes")
        except ValidationError:
            value = raw.strip()
        attributes[name.strip()] = value
    return {
        "tags_all": _split(data.get("tags_all", "")),
        "tags_any": _split(data.get("tags_any", "")),
        "tags_none": _split(data.get("tags_none", "")),
        "attributes": attributes,
        "consent_required": data.get("consent_required") or None,
    }


SEGMENT_FIELDS = {
    "segment.name": "name",
    "segment.rules.tags_all": "tags_all",
    "segment.rules.tags_any": "tags_any",
    "segment.rules.tags_none": "tags_none",
    "segment.rules.attributes": "attributes",
    "segment.rules.consent_required": "consent_required",
}
"""The segment form's inputs by the domain field path a refusal names (``botmesh_admin.formerrors``)."""
SEGMENT_LABELS = {
    "name": "Name",
    "tags_all": "Has all tags",
    "tags_any": "Has any tag",
    "tags_none": "Has none of the tags",
    "attributes": "Attributes",
    "consent_required": "Marketing consent",
}


@tenant_page("agent")
def segments(request: HttpRequest, tenant: str) -> HttpResponse:
    """Saved segments with live counts; admins create new ones here."""
    form = request.POST if request.method == "POST" else {}
    refused = None
    if request.method == "POST":
        try:
            page_principal(request).require("admin")
            segment = services.segment_create(
                tenant, name=request.POST.get("name", ""), rules=rules_from_form(request.POST)
            )
            tasks.dispatch_segment_build(tenant)
            messages.success(request, f"Segment {segment.name!r} saved.")
            return redirect("crm:segments", tenant=tenant)
        except DomainError as exc:
            refused = form_error(exc, form="segment", fields=SEGMENT_FIELDS, typed=request.POST)
    items = selectors.segment_list(tenant)
    counts = selectors.segment_counts(tenant, items)
    return _render(
        request,
        "crm/segments.html",
        "crm/_segment_rows.html",
        {
            "tenant": tenant,
            "segments": [(s, counts[s.id]) for s in items],
            "channels": CHANNELS,
            "form": form,
            "form_error": refused,
            "is_admin": page_principal(request).can("admin"),
        },
        refused.status if refused else 200,
    )


@tenant_page("agent")
def segment_preview(request: HttpRequest, tenant: str) -> HttpResponse:
    """The live count and first members of the rules being edited (an htmx fragment)."""
    try:
        preview = selectors.segment_preview(tenant, rules_from_form(request.POST or request.GET), limit=10)
    except DomainError as exc:
        refused = form_error(exc, form="segment", fields=SEGMENT_FIELDS)
        # The preview names the input too: it is shown below the form, not next to the field.
        label = SEGMENT_LABELS.get(refused.field or "", "")
        return render(
            request,
            "crm/_segment_preview.html",
            {"tenant": tenant, "error": f"{label}: {refused.message}" if label else refused.message},
        )
    return render(request, "crm/_segment_preview.html", {"tenant": tenant, "preview": preview})


@tenant_page("agent")
def segment_detail(request: HttpRequest, tenant: str, segment_id: str) -> HttpResponse:
    """One segment: rules, live count and the first 50 members."""
    segment = selectors.segment_get(tenant, segment_id)
    preview = selectors.segment_preview(tenant, segment.id, limit=50)
    return render(
        request,
        "crm/segment.html",
        {
            "tenant": tenant,
            "segment": segment,
            "preview": preview,
            "attributes": [(k, json.dumps(v, ensure_ascii=False)) for k, v in segment.rules.attributes.items()],
            "is_admin": page_principal(request).can("admin"),
            "use": _segment_use(tenant, segment.id),
        },
    )


def _segment_use(tenant: str, segment_id: str) -> Any:
    from campaigns.selectors import campaigns_of_segment

    return campaigns_of_segment(tenant, segment_id)


@tenant_page("admin")
def segment_delete(request: HttpRequest, tenant: str, segment_id: str) -> HttpResponse:
    """Delete a segment once confirmed; one a live campaign needs is refused with its names (``SegmentInUse``)."""
    back = reverse("crm:segment", kwargs={"tenant": tenant, "segment_id": segment_id})
    try:
        if not confirmation.confirmed(request):
            segment = selectors.segment_get(tenant, segment_id)
            use = _segment_use(tenant, segment.id)
            finished = ", ".join(f"{c.name!r}" for c in use.finished)
            return confirmation.confirm_page(
                request,
                question=f"Delete the segment {segment.name!r}?",
                consequences=[
                    "The contacts stay; only the rule and its membership go.",
                    *(
                        [f"Finished campaigns sent to it ({finished}) keep their counts and show “segment deleted”."]
                        if use.finished
                        else []
                    ),
                ],
                button="Delete the segment",
                cancel_url=back,
                refusal=_in_use(use),
            )
        services.segment_delete(tenant, segment_id)
    except DomainError as exc:
        if exc.status == 409:  # in use: say why on the segment's page
            messages.error(request, error_text(exc))
            return confirmation.done(request, back)
        return render_error(request, exc)
    tasks.dispatch_segment_build(tenant)
    messages.success(request, "Segment deleted.")
    return confirmation.done(request, reverse("crm:segments", kwargs={"tenant": tenant}))


def _in_use(use: Any) -> str | None:
    """Why the segment cannot be deleted now (the campaigns that still need it), or ``None``."""
    if not use.needed:
        return None
    names = ", ".join(f"{c.name!r} ({c.state})" for c in use.needed)
    return f"Used by {names}: finish, cancel or delete {'them' if len(use.needed) > 1 else 'it'} first."
