"""Admin pages of the inbox, under ``/t/<tenant>/inbox/``.

The list (mine / unassigned / all, by status and channel, unread only) sits
beside the open thread; its head shows each view's unread messages (exact
count reads, the overview's number for "all"). Everything is readable without
JavaScript: filters are a GET form, actions are POST forms that redirect back
(PRG); a refused one answers its status with the page. With htmx the list
and the thread poll for updates (``_list`` / ``_thread`` fragments) and actions
swap the thread panel in place. Opening a conversation moves the agent's read
marker to its newest message.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages as flash
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from botmesh_admin.channels.domain import CHANNEL_KINDS, send_hint
from botmesh_admin.errors import BadRequest, Conflict, DomainError, NotFound, ValidationError
from botmesh_admin.formerrors import form_error
from botmesh_admin.tenancy.decorators import list_query_checked, page_principal, tenant_page
from botmesh_admin.validation import ascii_digits, validate_text

from . import selectors, services
from .domain import CONVERSATION_ID_RE, CONVERSATION_STATUSES, Conversation, ConversationEvent, Message, Note
from .services import replies

PAGE = 50
THREAD = 200


def _agent(request: HttpRequest) -> str:
    return request.user.get_username()


def _filters(request: HttpRequest) -> dict[str, Any]:
    """Return the list's filters from the address; raise ``BadRequest`` (400) naming a bad one."""
    view = request.GET.get("view") or "all"
    status = request.GET.get("status") or None
    # ``channel`` is a kind (``whatsapp``) or one channel of the tenant (``whatsapp/ventas``).
    channel = request.GET.get("channel") or None
    kind, _, name = (channel or "").partition("/")
    # ``channel_name`` is the API's name of the same filter (a name the tenant has none of: no rows).
    name = name or request.GET.get("channel_name") or ""
    unread = request.GET.get("unread") or None
    for field, value, choices in (
        ("unread", unread, ("1", "0")),
        ("view", view, selectors.VIEWS),
        ("status", status, CONVERSATION_STATUSES),
        ("channel", kind or None, CHANNEL_KINDS),
    ):
        if value is not None and value not in choices:
            raise BadRequest(
                f"{field}: must be one of {', '.join(choices)} (remove it from the address to see the whole list)",
                field=field,
            )
    return {
        "view": view,
        "status": status,
        "channel": channel,
        "channel_kind": kind or None,
        "channel_name": name or None,
        "unread": unread == "1",
        # The CRM contact page's "Conversations with this contact" (an unknown contact: no rows).
        "contact": request.GET.get("contact") or None,
        "q": _search(request.GET.get("q") or ""),
    }


def _search(typed: str) -> str | None:
    """Return the list's text search; raise ``BadRequest`` (400), as the contacts page does, for one the API refuses."""
    from crm.selectors import MAX_QUERY

    try:
        return validate_text(typed.strip(), "q", max_len=MAX_QUERY, blank=True) or None
    except ValidationError as exc:
        raise BadRequest(f"{exc.message} (change the search, or clear it to see the whole list)", field="q") from None


def _query(filters: dict[str, Any], **extra: Any) -> str:
    data = {
        k: v for k, v in filters.items() if v not in (None, False, "all") and k not in ("channel_kind", "channel_name")
    }
    if data.get("unread"):
        data["unread"] = "1"
    if filters.get("channel_name") and "/" not in (filters.get("channel") or ""):
        data["channel_name"] = filters["channel_name"]  # given as ?channel_name=, kept as such
    data.update({k: v for k, v in extra.items() if v})
    return urlencode(data)


def _list_context(request: HttpRequest, tenant: str, selected: str | None, *, head: bool = True) -> dict[str, Any]:
    """The list's template context; ``head``: also the unread count of each view, for the page's head.

    The htmx poll of the rows alone (``list_fragment``) leaves the counts out.
    """
    filters = _filters(request)
    agent = _agent(request)
    context = _rows_context(request, tenant, selected, filters, agent)
    if head:
        # Exact and O(1) each (two count reads): the same number the overview shows for "all".
        context["view_unread"] = {v: selectors.unread_total(tenant, agent=agent, view=v) for v in selectors.VIEWS}
    return context


def _rows_context(
    request: HttpRequest, tenant: str, selected: str | None, filters: dict[str, Any], agent: str
) -> dict[str, Any]:
    if filters["q"]:
        return _search_context(request, tenant, selected, filters, agent)
    with list_query_checked():
        rows, cursor = selectors.conversation_list(
            tenant,
            agent=agent,
            view=filters["view"],
            status=filters["status"],
            channel=filters["channel_kind"],
            channel_name=filters["channel_name"],
            contact_id=filters["contact"],
            unread_only=filters["unread"],
            limit=PAGE,
            after=request.GET.get("after") or None,
        )
    return _page_context(tenant, rows, cursor, filters, selected, agent)


def _page_context(
    tenant: str,
    rows: list[selectors.ConversationRow],
    cursor: str | None,
    filters: dict[str, Any],
    selected: str | None,
    agent: str,
) -> dict[str, Any]:
    """The template context of one page of the list, the same for a plain list and a search."""
    from botmesh_admin.channels.selectors import channel_config_list

    return {
        "tenant": tenant,
        "rows": rows,
        "next": cursor,
        "filters": filters,
        "query": _query(filters),
        "channel_configs": channel_config_list(tenant),
        "selected": selected,
        "agent": agent,
        "views": [("mine", "Mine"), ("unassigned", "Unassigned"), ("all", "All")],
        "view_links": {v: _query(dict(filters, view=v)) for v in selectors.VIEWS},
    }


def _search_context(
    request: HttpRequest, tenant: str, selected: str | None, filters: dict[str, Any], agent: str
) -> dict[str, Any]:
    """The list as a search: names and phones through the index (the list's filters apply), then message
    text by a bounded scan (the first page only; the page says what it searched)."""
    from botmesh_admin.kv.indexes import IndexNotBuilt

    after = request.GET.get("after") or None
    search: dict[str, Any] = {"q": filters["q"], "per_conversation": selectors.TEXT_SCAN_MESSAGES}
    rows: list[selectors.ConversationRow] = []
    cursor = None
    try:
        with list_query_checked():
            rows, cursor = selectors.conversation_search(
                tenant,
                filters["q"],
                agent=agent,
                view=filters["view"],
                status=filters["status"],
                channel=filters["channel_kind"],
                channel_name=filters["channel_name"],
                contact_id=filters["contact"],
                limit=PAGE,
                after=after,
            )
    except IndexNotBuilt:
        search["unavailable"] = "the search index is still being built (manage.py botmesh_reindex); try again soon"
    if after is None:
        search["messages"], search["scanned"] = selectors.message_search(tenant, filters["q"], agent=agent)
    return _page_context(tenant, rows, cursor, filters, selected, agent) | {"search": search}


def _entries(messages: list[Message], notes: list[Note], events: list[ConversationEvent]) -> list[dict[str, Any]]:
    """Messages, notes and events (assigned, handoff, status) in one timeline, in time order."""
    items: list[dict[str, Any]] = [
        {"kind": "message", "m": m, "at": m.timestamp_ms, "hint": _hint(m)} for m in messages
    ]
    items += [{"kind": "note", "n": n, "at": n.created_at_ms} for n in notes]
    items += [{"kind": "event", "e": e, "at": e.at_ms} for e in events]
    items.sort(key=lambda e: e["at"])  # stable: a reply and the takeover it caused keep that order
    return items


def _hint(m: Message) -> str | None:
    code = m.reply.error_code if m.reply is not None and m.reply.error_code else m.error_code
    return (send_hint(code) or None) if code else None  # the channels' one code table


def _missing(conversation_id: str) -> NotFound:
    """Return the 404 of a conversation address that names none of this tenant's (erased, mistyped, foreign)."""
    return NotFound(f"conversation {conversation_id[:40]} not found")


def _missing_page(request: HttpRequest, template: str) -> HttpResponse:
    """Render the 404 of a conversation that does not exist, in an agent's words."""
    shown = _Shown(
        404,
        "not_found",
        "It may have been erased, or the address is mistyped: the inbox lists every conversation.",
        title="This conversation does not exist.",
    )
    return render(request, template, {"error": shown}, status=404)


def _thread_context(request: HttpRequest, tenant: str, conversation_id: str) -> dict[str, Any]:
    """Return the thread's context; raise ``NotFound`` (404) for an address that names no conversation.

    An id that is not even shaped like one (``/inbox/bogus/``) is a page that
    does not exist too, not a validation error (422) of a form the agent filled.
    """
    agent = _agent(request)
    if not CONVERSATION_ID_RE.fullmatch(conversation_id):
        raise _missing(conversation_id)
    try:
        conv = selectors.conversation_get(tenant, conversation_id)
    except NotFound:
        raise _missing(conversation_id) from None
    if conv.last_message_id is not None:
        services.read_marker_set(tenant, conv.id, agent=agent)
    messages = selectors.message_latest(tenant, conv.id, limit=THREAD)
    notes, _ = selectors.note_list(tenant, conv.id, limit=200)
    # The events of the time the shown messages span (from the oldest shown on), at most THREAD.
    since = messages[0].timestamp_ms if messages and conv.message_count > len(messages) else None
    events = selectors.event_list(tenant, conv.id, since_ms=since, limit=THREAD)
    return {
        "tenant": tenant,
        "c": conv,
        "status": selectors.effective_status(conv),
        "entries": _entries(messages, notes, events),
        "agent": agent,
        "members": selectors.member_usernames(tenant),
        "query": _query(_filters(request)),
        "can_erase": page_principal(request).can("admin"),
        "reply": _reply_policy(request, tenant, conv, agent),
    }


def _reply_policy(request: HttpRequest, tenant: str, conv: Conversation, agent: str) -> dict[str, bool]:
    """What the composer offers: ``others`` — the conversation is another agent's and only
    "Assign to me and reply" is offered; ``takes_over`` — sending takes the chat from the bot."""
    settings = selectors.inbox_settings_get(tenant)
    mine_to_answer = conv.assignee in (None, agent) or settings.reply_to_others or page_principal(request).can("admin")
    return {"others": not mine_to_answer, "takes_over": settings.reply_takes_over and not conv.handed_off}


@tenant_page("agent")
def inbox_list(request: HttpRequest, tenant: str) -> HttpResponse:
    """The conversation list, with no conversation open."""
    return render(request, "inbox/inbox.html", _list_context(request, tenant, None))


@tenant_page("agent")
def conversation(request: HttpRequest, tenant: str, conversation_id: str) -> HttpResponse:
    """The list beside one open conversation."""
    context = _list_context(request, tenant, conversation_id)
    try:
        context.update(_thread_context(request, tenant, conversation_id))
    except NotFound:
        return _missing_page(request, "error.html")
    return render(request, "inbox/inbox.html", context)


@tenant_page("agent")
def list_fragment(request: HttpRequest, tenant: str) -> HttpResponse:
    """The list panel alone (htmx polling)."""
    return render(request, "inbox/_list.html", _list_context(request, tenant, request.GET.get("selected"), head=False))


@tenant_page("agent")
def thread_fragment(request: HttpRequest, tenant: str, conversation_id: str) -> HttpResponse:
    """The thread panel alone (action answers), or its live part (``?part=live``, htmx polling)."""
    template = "inbox/_live.html" if request.GET.get("part") == "live" else "inbox/_thread.html"
    try:
        return render(request, template, _thread_context(request, tenant, conversation_id))
    except NotFound:
        return _missing_page(request, "_error.html")


def _after_action(request: HttpRequest, tenant: str, conversation_id: str, done: str | None = None) -> HttpResponse:
    if request.headers.get("HX-Request"):
        response = render(request, "inbox/_thread.html", _thread_context(request, tenant, conversation_id))
        response["HX-Trigger"] = "inbox-changed"
        return response
    if done:
        flash.success(request, done)
    url = reverse("inbox:conversation", kwargs={"tenant": tenant, "conversation_id": conversation_id})
    query = request.POST.get("query", "")
    return redirect(f"{url}?{query}" if query else url)


@dataclass(frozen=True)
class _Shown:
    """An error as an agent reads it (``_error.html``)."""

    status: int
    code: str
    message: str
    title: str | None = None


def _as_shown(exc: DomainError, tenant: str, conversation_id: str) -> DomainError | _Shown:
    """Say a conflict in the agent's words: who changed what, and that the thread now shows it."""
    if not isinstance(exc, Conflict):
        return exc
    try:
        conv = selectors.conversation_get(tenant, conversation_id)
    except DomainError:
        return exc
    who = f"assigned to @{conv.assignee}" if conv.assignee else "unassigned"
    return _Shown(
        exc.status,
        exc.code,
        f"It is now {who} and {selectors.effective_status(conv)}; the thread "
        "shows it as it is now. Try again if you still want to.",
        title="Someone changed this conversation meanwhile.",
    )


def _action_refused(request: HttpRequest, tenant: str, conversation_id: str, exc: DomainError) -> HttpResponse:
    """Answer a refused action with its status (409, 422 …): the thread, or the whole page, with the error on top.

    The agent sees why (someone else assigned it; a value no form sends) and
    the conversation as it is now. Only when the conversation itself is gone
    does the answer redirect back with the error as a message.
    """
    shown = _as_shown(exc, tenant, conversation_id)
    try:
        thread = _thread_context(request, tenant, conversation_id)
    except NotFound:
        flash.error(request, f"{shown.title} {shown.message}" if isinstance(shown, _Shown) else exc.message)
        return _after_action(request, tenant, conversation_id, None)
    if request.headers.get("HX-Request"):
        return render(request, "inbox/_thread.html", {**thread, "error": shown}, status=exc.status)
    context = _list_context(request, tenant, conversation_id)
    context.update(thread, error=shown)
    return render(request, "inbox/inbox.html", context, status=exc.status)


TYPED_FORMS = {
    "reply": {"reply.text": "text"},
    "note": {"note.text": "text"},
    # Resolve / Reopen / Snooze: the buttons' ``status`` and the snooze's hours, in the form's words.
    "status": {"status": "status", "snooze_hours": "snooze_hours", "snoozed_until_ms": "snooze_hours"},
}
"""The thread's forms that keep what the agent typed when refused: form → {domain field path: input name}."""


def _action(view: Any) -> Any:
    """Run a POST action; a domain error becomes a message (or an htmx error fragment)."""

    form = view.__name__

    def wrapper(request: HttpRequest, tenant: str, conversation_id: str) -> HttpResponse:
        try:
            done = view(request, tenant, conversation_id)
        except DomainError as exc:
            if form not in TYPED_FORMS or not (
                isinstance(exc, ValidationError) or (isinstance(exc, Conflict) and form == "reply")
            ):
                return _action_refused(request, tenant, conversation_id, exc)
            # A refused reply or note (bad input, or another agent's conversation): the thread again (the
            # whole page without htmx), the text the agent typed still in its box and the problem under it
            # (``botmesh_admin.formerrors``); a conflict answers 409 with or without JavaScript.
            refused = form_error(exc, form=form, fields=TYPED_FORMS[form], typed=request.POST)
            assignee = exc.details.get("assignee") if isinstance(exc, Conflict) else None
            if assignee:
                refused = dataclasses.replace(
                    refused, message=f"Assigned to @{assignee} — assign it to yourself to reply."
                )
            if request.headers.get("HX-Request"):
                context = {**_thread_context(request, tenant, conversation_id), "form_error": refused}
                return render(request, "inbox/_thread.html", context, status=exc.status)
            context = _list_context(request, tenant, conversation_id)
            context.update(_thread_context(request, tenant, conversation_id), form_error=refused)
            return render(request, "inbox/inbox.html", context, status=exc.status)
        return _after_action(request, tenant, conversation_id, done)

    wrapper.__name__ = view.__name__
    wrapper.__doc__ = view.__doc__
    return require_POST(tenant_page("agent")(wrapper))


def _version(request: HttpRequest) -> int:
    """Return the form's ``expected_version`` (the version the agent saw); ``ValidationError`` naming it otherwise."""
    given = request.POST.get("expected_version")
    if not given:
        raise ValidationError("expected_version", "is missing: reload the conversation and try again")
    if not ascii_digits(given):
        raise ValidationError("expected_version", "must be the conversation's version, a whole number")
    return int(given)


@_action
def assign(request: HttpRequest, tenant: str, conversation_id: str) -> str:
    """Assign to a member (or to nobody) — compare-and-set on the version the agent saw."""
    agent = request.POST.get("agent") or None
    if agent is not None and not selectors.agent_is_member(tenant, agent):
        raise ValidationError("agent", "is not a member of this tenant")
    services.conversation_assign(
        tenant, conversation_id, agent=agent, expected_version=_version(request), actor=_agent(request)
    )
    return f"Assigned to {agent}" if agent else "Unassigned"


@_action
def handoff(request: HttpRequest, tenant: str, conversation_id: str) -> str:
    """Take the chat from the bot (``active=1``), or give it back (``active=0``)."""
    given = request.POST.get("active")
    if given not in ("0", "1"):  # never read a value no form sends as "give it back"
        raise ValidationError("active", "choose 1 (take the chat from the bot) or 0 (give it back)")
    active = given == "1"
    services.conversation_handoff(tenant, conversation_id, active=active, actor=_agent(request))
    return "You took this chat from the bot" if active else "The bot answers this chat again"


@_action
def status(request: HttpRequest, tenant: str, conversation_id: str) -> str:
    """Resolve, reopen, or set pending (snoozed for a number of hours)."""
    new = request.POST.get("status", "")
    hours = request.POST.get("snooze_hours")
    until = None
    if new == "pending" and hours:
        from .domain import now_ms

        try:
            hours_f = float(hours)
        except ValueError:
            raise ValidationError("snooze_hours", "not a number") from None
        if not 0 < hours_f < 24 * 366:  # the API's words are "snoozed_until_ms: must be in the future"
            raise ValidationError("snooze_hours", "snooze for more than 0 hours, at most a year")
        until = now_ms() + int(hours_f * 3_600_000)
    if new not in CONVERSATION_STATUSES:
        raise ValidationError("status", f"choose one of {', '.join(CONVERSATION_STATUSES)}")
    services.conversation_status_set(tenant, conversation_id, status=new, snoozed_until_ms=until, actor=_agent(request))
    return f"Marked {new}"


@_action
def note(request: HttpRequest, tenant: str, conversation_id: str) -> str:
    """Add a private note."""
    services.note_add(tenant, conversation_id, author=_agent(request), text=request.POST.get("text", ""))
    return "Note added"


@_action
def reply(request: HttpRequest, tenant: str, conversation_id: str) -> str:
    """Queue a reply through the outbox (the form's idempotency key makes a double submit harmless)."""
    assign = request.POST.get("assign") == "1"  # "Assign to me and reply"
    replies.reply_create(
        tenant,
        conversation_id,
        author=_agent(request),
        text=request.POST.get("text", ""),
        idempotency_key=request.POST.get("idempotency_key") or None,
        admin=page_principal(request).can("admin"),
        assign=assign,
    )
    return "Assigned to you; reply queued" if assign else "Reply queued"


@_action
def resend(request: HttpRequest, tenant: str, conversation_id: str) -> str:
    """Resend a not confirmed or failed reply, at the agent's explicit request."""
    replies.reply_resend(
        tenant, request.POST.get("message_id", ""), conversation_id=conversation_id, actor=_agent(request)
    )
    return "Reply queued again"


@require_POST
@tenant_page("admin")
def erase(request: HttpRequest, tenant: str, conversation_id: str) -> HttpResponse:
    """Erase the conversation (admins): messages, notes and read markers go too."""
    try:
        services.conversation_erase(tenant, conversation_id)
        flash.success(request, "Conversation erased")
    except DomainError as exc:
        flash.error(request, exc.message)
    return redirect("inbox:list", tenant=tenant)


def conversation_title(c: Conversation) -> str:
    """Return the name an agent sees for a conversation."""
    return c.display_name or c.chat_key
