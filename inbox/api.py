"""``/api/v1/tenants/{tenant}/…`` — conversations, messages, notes, assignment, handoff, replies, ledger push.

Agents act as themselves (``user:<username>`` sessions; a token acts as
``token-<id>``). Stale versions answer 409 with ``current_version`` and the
current ``assignee``; a conversation of another tenant is 404.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema, Status
from pydantic import ConfigDict, StrictBool

from botmesh_admin.api import CursorParams, ErrorOut, one_of, principal, requires
from botmesh_admin.channels.domain import CHANNEL_KINDS
from botmesh_admin.errors import ValidationError
from botmesh_admin.tenancy.principal import Principal, token_agent
from botmesh_admin.tenancy.selectors import agent_label

from . import selectors, services
from .domain import CONVERSATION_STATUSES, Conversation, Message, Note
from .services import replies
from .stores.base import VIEWS

router = Router(tags=["inbox"])

ERRORS: dict[int, Any] = {401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 422: ErrorOut}
WRITE_ERRORS: dict[int, Any] = {**ERRORS, 409: ErrorOut}


def agent_of(p: Principal) -> str:
    """Return the agent id a principal acts as: its username, or ``token-<id>`` for an API token."""
    if p.actor.startswith("user:"):
        return p.actor.removeprefix("user:")
    return token_agent(p.token_id)


def _name_in(context: Any, agent_id: str | None) -> str | None:
    """Return ``agent_label`` of ``agent_id`` in the tenant of the request being answered (``None``: none)."""
    if agent_id is None:
        return None
    request = context["request"] if context else None
    tenant = getattr(request, "auth", None)
    tenant = tenant.tenant if isinstance(tenant, Principal) else None
    return agent_id if tenant is None else agent_label(tenant, agent_id)


@contextmanager
def request_fields(names: Mapping[str, str]) -> Iterator[None]:
    """Raise a ``ValidationError`` of a domain path (``note.text``) under the body's own field (``text``).

    A 422 names the field of the request the caller sent, whichever check
    refused it: the schema's (a wrong type) or the service's (blank, too long,
    a bidi override). ``names``: domain path → request field; others pass as they are.
    """
    try:
        yield
    except ValidationError as exc:
        field = names.get(exc.field or "")
        if field is None:
            raise
        raise type(exc)(field, exc.problem) from None


# -- schemas ------------------------------------------------------------------------------


class BodyIn(Schema):
    """A request body: a field it does not declare is a 422 naming that field (a typo is
    never ignored and answered 200 with nothing changed)."""

    model_config = ConfigDict(extra="forbid", strict=True)


NAME_DESCRIPTION = "how the pages name the agent: a username as it is, an API token as token:<name>"


class _HandoffNames(Schema):
    """``taken_by_name`` and ``released_by_name`` of a handoff's ``taken_by`` / ``released_by`` (``_name_in``)."""

    taken_by_name: str | None = Field(None, description=NAME_DESCRIPTION)
    released_by_name: str | None = Field(None, description=NAME_DESCRIPTION)

    @staticmethod
    def resolve_taken_by_name(obj: Mapping[str, Any], context: Any) -> str | None:
        return _name_in(context, obj.get("taken_by"))

    @staticmethod
    def resolve_released_by_name(obj: Mapping[str, Any], context: Any) -> str | None:
        return _name_in(context, obj.get("released_by"))


class HandoffOut(_HandoffNames):
    """Who took the chat from the bot and when; ``active`` False once given back."""

    active: bool
    taken_by: str
    taken_at_ms: int
    released_by: str | None = None
    released_at_ms: int | None = None


class ConversationOut(Schema):
    """A conversation. ``status`` is what agents see (a snooze whose time came is ``open``);
    ``version`` is what ``assign`` and other agent actions compare; ``unread`` counts the
    caller's unread inbound messages."""

    id: str
    chat_key: str
    channel: str
    channel_name: str | None = Field(
        None,
        description="the tenant's channel (WhatsApp number or Telegram bot) that received the chat; "
        "replies go out through it. null: stored before conversations belonged to a channel",
    )
    status: str
    stored_status: str
    assignee: str | None
    assignee_name: str | None = Field(None, description=NAME_DESCRIPTION)
    version: int
    contact_id: str | None
    display_name: str | None
    blocked: bool
    blocked_at_ms: int | None
    handoff: HandoffOut | None
    snoozed_until_ms: int | None
    created_at_ms: int
    last_activity_ms: int
    last_text: str | None
    last_direction: str | None
    message_count: int
    inbound_count: int
    unread: int

    @staticmethod
    def resolve_assignee_name(obj: Mapping[str, Any], context: Any) -> str | None:
        return _name_in(context, obj.get("assignee"))


class ReactionOut(Schema):
    sender_id: str
    emoji: str
    at_ms: int


class EditOut(Schema):
    """A previous text of an edited message."""

    text: str | None
    replaced_at_ms: int


class ReplyOut(Schema):
    """Delivery of an agent's reply: queued, sending, accepted, failed (``error_code``) or not_confirmed."""

    author: str
    author_name: str = Field("", description=NAME_DESCRIPTION)
    state: str
    attempts: int
    error_code: int | None
    error_title: str | None
    retry_at_ms: int | None
    updated_at_ms: int

    @staticmethod
    def resolve_author_name(obj: Mapping[str, Any], context: Any) -> str | None:
        return _name_in(context, obj["author"])


class MessageOut(Schema):
    """A message. ``status``: sent < delivered < read, or failed (``error_code``, ``error_title``)."""

    id: str
    conversation_id: str
    direction: str
    type: str
    timestamp_ms: int
    text: str | None
    sender_id: str | None
    sender_name: str | None
    provider_message_id: str | None
    source: str
    status: str | None
    status_at_ms: int | None
    error_code: int | None
    error_title: str | None
    reactions: list[ReactionOut]
    button: dict[str, Any] | None
    media: dict[str, Any] | None
    location: dict[str, Any] | None
    reply_to: str | None
    edits: list[EditOut]
    dropped: str | None
    placeholder: bool
    reply: ReplyOut | None


class NoteOut(Schema):
    id: str
    conversation_id: str
    author: str
    author_name: str = Field("", description=NAME_DESCRIPTION)
    text: str
    created_at_ms: int

    @staticmethod
    def resolve_author_name(obj: Mapping[str, Any], context: Any) -> str | None:
        return _name_in(context, obj["author"])


class ConversationPage(Schema):
    """One page of conversations; pass ``next`` as ``after`` for the following one."""

    items: list[ConversationOut]
    next: str | None = None


class MessagePage(Schema):
    items: list[MessageOut]
    next: str | None = None


class NotePage(Schema):
    """Notes oldest first; ``next`` is the id of the last note (pass it as ``after``)."""

    items: list[NoteOut]
    next: str | None = None


class ConversationFilters(CursorParams):
    """``view`` all / mine / unassigned; ``status`` open / pending / resolved; ``channel``; ``unread``."""

    view: str = one_of(VIEWS, "all")
    status: str | None = one_of(CONVERSATION_STATUSES, None)
    channel: str | None = one_of(CHANNEL_KINDS, None)
    channel_name: str | None = Field(
        None,
        description="only the conversations this channel (number or bot) received (one the tenant has none of: [])",
    )
    contact: str | None = Field(
        None,
        description="only the conversations linked to this CRM contact id (a contact's conversations_url; "
        "an unknown contact: [])",
    )
    unread: bool = False
    q: str | None = Field(
        None,
        max_length=200,
        description="text search: every word a prefix of the contact's name words, or a phone number's digits "
        "(international or national), or a Telegram id; the other filters apply, except unread; items come in "
        "the search index's order",
    )


class AssignIn(BodyIn):
    """Compare-and-set: ``expected_version`` is the conversation's ``version`` you saw."""

    agent: str | None = Field(None, description="username to assign, or null to unassign")
    expected_version: int


class HandoffIn(BodyIn):
    """``active`` true: a human takes the chat (the bot must stop answering); false: give it back."""

    active: StrictBool  # a JSON true or false: "yes" or 1 are refused, not guessed
    expected_version: int | None = None


class StatusIn(BodyIn):
    status: str = one_of(CONVERSATION_STATUSES)
    snoozed_until_ms: int | None = Field(None, description="pending only: reopen at this time (epoch ms)")
    expected_version: int | None = None


class NoteIn(BodyIn):
    text: str


class ReadIn(BodyIn):
    """The last message the caller read (default: the newest)."""

    message_id: str | None = None


class ReadOut(Schema):
    conversation_id: str
    agent: str
    message_id: str
    at_ms: int
    unread: int


class ReplyIn(BodyIn):
    """An agent's reply. Send the same ``idempotency_key`` when retrying a request.

    ``assign`` true: assign the conversation to yourself and reply, in one step
    (a reply in another agent's conversation is otherwise a 409 naming them).
    """

    text: str
    idempotency_key: str | None = Field(None, max_length=200)
    assign: StrictBool = False


class InboxSettingsOut(Schema):
    """What replying means in this tenant (README, "Inbox").

    ``reply_takes_over``: an agent's reply in a chat the bot is handling takes it
    from the bot (handoff). ``reply_to_others``: agents may reply in a
    conversation assigned to another agent (admins always may).
    """

    reply_takes_over: bool
    reply_to_others: bool


class InboxSettingsIn(BodyIn):
    """Change one or both settings (a missing one is kept)."""

    reply_takes_over: StrictBool | None = None
    reply_to_others: StrictBool | None = None


class EraseOut(Schema):
    conversation_id: str
    records_removed: int


class LedgerOut(Schema):
    """How many records were journaled (``accepted``) or had been pushed before (``duplicates``)."""

    records: int
    accepted: int
    duplicates: int


class HandoffStateOut(_HandoffNames):
    """``handed_off`` true: a human holds the chat and the bot must not answer it."""

    chat_id: str
    handed_off: bool
    conversation_id: str | None
    taken_by: str | None
    taken_at_ms: int | None
    released_by: str | None
    released_at_ms: int | None


def conversation_out(c: Conversation, unread: int) -> dict[str, Any]:
    """Return the API form of a conversation."""
    data = c.to_json()
    data["stored_status"] = c.status
    data["status"] = selectors.effective_status(c)
    data["unread"] = unread
    return data


def message_out(m: Message) -> dict[str, Any]:
    """Return the API form of a message."""
    return m.to_json()


def note_out(n: Note) -> dict[str, Any]:
    """Return the API form of a note."""
    return n.to_json()


def _conversation(request: HttpRequest, tenant: str, c: Conversation) -> dict[str, Any]:
    unread = selectors.unread_count(tenant, c, agent=agent_of(principal(request)))
    return conversation_out(c, unread)


# -- conversations --------------------------------------------------------------------


@router.get("conversations", response={200: ConversationPage, **ERRORS})
@requires("agent")
def conversation_list(request: HttpRequest, tenant: str, filters: Query[ConversationFilters]) -> dict[str, Any]:
    """List conversations, newest activity first, with the caller's unread counts (or those ``q`` finds)."""
    if filters.q is not None and filters.q.strip():
        if filters.unread:
            raise ValidationError("unread", "cannot be combined with q")
        rows, cursor = selectors.conversation_search(
            tenant,
            filters.q,
            agent=agent_of(principal(request)),
            view=filters.view,
            status=filters.status,
            channel=filters.channel,
            channel_name=filters.channel_name,
            contact_id=filters.contact,
            limit=filters.limit,
            after=filters.after,
        )
        return {"items": [conversation_out(r.conversation, r.unread) for r in rows], "next": cursor}
    rows, cursor = selectors.conversation_list(
        tenant,
        agent=agent_of(principal(request)),
        view=filters.view,
        status=filters.status,
        channel=filters.channel,
        unread_only=filters.unread,
        limit=filters.limit,
        after=filters.after,
        channel_name=filters.channel_name,
        contact_id=filters.contact,
    )
    return {"items": [conversation_out(r.conversation, r.unread) for r in rows], "next": cursor}


@router.get("conversations/{conversation_id}", response={200: ConversationOut, **ERRORS})
@requires("agent")
def conversation_get(request: HttpRequest, tenant: str, conversation_id: str) -> dict[str, Any]:
    """Return one conversation."""
    return _conversation(request, tenant, selectors.conversation_get(tenant, conversation_id))


@router.get("conversations/{conversation_id}/messages", response={200: MessagePage, **ERRORS})
@requires("agent")
def message_list(
    request: HttpRequest, tenant: str, conversation_id: str, params: Query[CursorParams]
) -> dict[str, Any]:
    """List messages oldest first (timestamp, then id); ``next`` continues after the last one."""
    items, cursor = selectors.message_list(tenant, conversation_id, after=params.after, limit=params.limit)
    return {"items": [message_out(m) for m in items], "next": cursor}


@router.get("conversations/{conversation_id}/notes", response={200: NotePage, **ERRORS})
@requires("agent")
def note_list(request: HttpRequest, tenant: str, conversation_id: str, params: Query[CursorParams]) -> dict[str, Any]:
    """List private notes oldest first; ``after`` is the id of the last note of the previous page."""
    items, cursor = selectors.note_list(tenant, conversation_id, limit=params.limit, after=params.after)
    return {"items": [note_out(n) for n in items], "next": cursor}


class ConversationEventOut(Schema):
    """A change of the conversation: ``kind`` assigned (``value``: the assignee) / unassigned /
    handoff_taken / handoff_released / status (``value``: the new status), by ``actor`` (null: the system)."""

    id: str
    kind: str
    at_ms: int
    actor: str | None
    actor_name: str | None = Field(None, description=NAME_DESCRIPTION)
    value: str | None

    @staticmethod
    def resolve_actor_name(obj: Mapping[str, Any], context: Any) -> str | None:
        return _name_in(context, obj.get("actor"))


class ConversationEventPage(Schema):
    items: list[ConversationEventOut]


@router.get("conversations/{conversation_id}/events", response={200: ConversationEventPage, **ERRORS})
@requires("agent")
def event_list(
    request: HttpRequest, tenant: str, conversation_id: str, since_ms: int | None = None, limit: int = 200
) -> dict[str, Any]:
    """List who assigned, took over, resolved… the conversation, oldest first (at or after ``since_ms``)."""
    selectors.conversation_get(tenant, conversation_id)
    events = selectors.event_list(tenant, conversation_id, since_ms=since_ms, limit=limit)
    return {"items": [{k: getattr(e, k) for k in ("id", "kind", "at_ms", "actor", "value")} for e in events]}


@router.post("conversations/{conversation_id}/notes", response={201: NoteOut, **ERRORS})
@requires("agent")
def note_add(request: HttpRequest, tenant: str, conversation_id: str, body: NoteIn) -> Status:
    """Add a private note (never sent to the customer) as the caller."""
    with request_fields({"note.text": "text"}):
        note = services.note_add(tenant, conversation_id, author=agent_of(principal(request)), text=body.text)
    return Status(201, note_out(note))


@router.post("conversations/{conversation_id}/assign", response={200: ConversationOut, **WRITE_ERRORS})
@requires("agent")
def conversation_assign(request: HttpRequest, tenant: str, conversation_id: str, body: AssignIn) -> dict[str, Any]:
    """Assign (or unassign) by compare-and-set on ``expected_version``; 409 carries the current one."""
    if body.agent is not None and not selectors.agent_is_member(tenant, body.agent):
        raise ValidationError("agent", "is not a member of this tenant")
    conv = services.conversation_assign(
        tenant,
        conversation_id,
        agent=body.agent,
        expected_version=body.expected_version,
        actor=agent_of(principal(request)),
    )
    return _conversation(request, tenant, conv)


@router.post("conversations/{conversation_id}/handoff", response={200: ConversationOut, **WRITE_ERRORS})
@requires("agent")
def conversation_handoff(request: HttpRequest, tenant: str, conversation_id: str, body: HandoffIn) -> dict[str, Any]:
    """Take the chat from the bot (``active`` true) or give it back (false), as the caller."""
    conv = services.conversation_handoff(
        tenant,
        conversation_id,
        active=body.active,
        actor=agent_of(principal(request)),
        expected_version=body.expected_version,
        assignable=principal(request).token_id is None,  # a token never becomes the assignee
    )
    return _conversation(request, tenant, conv)


@router.post("conversations/{conversation_id}/status", response={200: ConversationOut, **WRITE_ERRORS})
@requires("agent")
def conversation_status(request: HttpRequest, tenant: str, conversation_id: str, body: StatusIn) -> dict[str, Any]:
    """Set open / pending / resolved (pending may be snoozed until a time)."""
    conv = services.conversation_status_set(
        tenant,
        conversation_id,
        status=body.status,
        snoozed_until_ms=body.snoozed_until_ms,
        expected_version=body.expected_version,
        actor=agent_of(principal(request)),
    )
    return _conversation(request, tenant, conv)


@router.post("conversations/{conversation_id}/read", response={200: ReadOut, **WRITE_ERRORS})
@requires("agent")
def conversation_read(request: HttpRequest, tenant: str, conversation_id: str, body: ReadIn) -> dict[str, Any]:
    """Move the caller's read marker forward to ``message_id`` (default: the newest message)."""
    agent = agent_of(principal(request))
    marker = services.read_marker_set(tenant, conversation_id, agent=agent, message_id=body.message_id)
    conv = selectors.conversation_get(tenant, conversation_id)
    return {
        "conversation_id": conversation_id,
        "agent": agent,
        "message_id": marker.message_id,
        "at_ms": marker.at_ms,
        "unread": selectors.unread_count(tenant, conv, agent=agent),
    }


@router.post("conversations/{conversation_id}/reply", response={202: MessageOut, **WRITE_ERRORS})
@requires("agent")
def conversation_reply(request: HttpRequest, tenant: str, conversation_id: str, body: ReplyIn) -> Status:
    """Queue a reply through the outbox; poll the message for ``reply.state``.

    A reply in a chat the bot is handling takes it from the bot (unless the
    tenant's ``reply_takes_over`` is off); in a conversation assigned to another
    agent it is a 409 naming the ``assignee`` unless the caller is an admin, the
    tenant's ``reply_to_others`` is on, or ``assign`` is true.
    """
    caller = principal(request)
    with request_fields({"reply.text": "text", "reply.idempotency_key": "idempotency_key"}):
        message = replies.reply_create(
            tenant,
            conversation_id,
            author=agent_of(caller),
            text=body.text,
            idempotency_key=body.idempotency_key,
            admin=caller.can("admin"),
            assign=body.assign,
            assignable=caller.token_id is None,  # a token never becomes the assignee
        )
    return Status(202, message_out(message))


@router.post("conversations/{conversation_id}/messages/{message_id}/resend", response={202: MessageOut, **WRITE_ERRORS})
@requires("agent")
def reply_resend(request: HttpRequest, tenant: str, conversation_id: str, message_id: str) -> Status:
    """Send a not confirmed or failed reply of this conversation again (the customer may receive it twice).

    A message of another conversation is 404, like a missing one.
    """
    selectors.conversation_get(tenant, conversation_id)
    message = replies.reply_resend(
        tenant, message_id, conversation_id=conversation_id, actor=agent_of(principal(request))
    )
    return Status(202, message_out(message))


@router.delete("conversations/{conversation_id}", response={200: EraseOut, **ERRORS})
@requires("admin")
def conversation_erase(request: HttpRequest, tenant: str, conversation_id: str) -> dict[str, Any]:
    """Erase the conversation with its messages, notes and read markers (right to erasure; admins)."""
    removed = services.conversation_erase(tenant, conversation_id)
    return {"conversation_id": conversation_id, "records_removed": removed}


@router.get("inbox/settings", response={200: InboxSettingsOut, **ERRORS})
@requires("agent")
def inbox_settings_get(request: HttpRequest, tenant: str) -> dict[str, Any]:
    """Return what replying means in this tenant."""
    return selectors.inbox_settings_get(tenant).to_json()


@router.patch("inbox/settings", response={200: InboxSettingsOut, **WRITE_ERRORS})
@requires("admin")
def inbox_settings_set(request: HttpRequest, tenant: str, body: InboxSettingsIn) -> dict[str, Any]:
    """Change what replying means in this tenant (admins)."""
    return services.inbox_settings_set(
        tenant, reply_takes_over=body.reply_takes_over, reply_to_others=body.reply_to_others
    ).to_json()


# -- bots -----------------------------------------------------------------------------


@router.get("handoff/{chat_id}", response={200: HandoffStateOut, **ERRORS})
@requires("member")
def handoff_get(request: HttpRequest, tenant: str, chat_id: str, channel: str | None = None) -> dict[str, Any]:
    """For bots: is this chat handed off to a human (then do not answer it)?

    ``channel`` names the bot's channel configuration (its number or bot); without it
    the chat is handed off if its conversation on any of the tenant's channels is.
    """
    state = selectors.handoff_get(tenant, chat_id, channel_name=channel)
    return {
        "chat_id": chat_id,
        "handed_off": state.handed_off,
        "conversation_id": state.conversation_id,
        "taken_by": state.taken_by,
        "taken_at_ms": state.taken_at_ms,
        "released_by": state.released_by,
        "released_at_ms": state.released_at_ms,
    }


class StoredMessageIn(Schema):
    """A bot's ledger record. ``timestamp`` is epoch ms; ``dropped`` names why the bot did not send it."""

    id: str
    tenantId: str | None = None  # noqa: N815 - the ledger's own field names
    channel: str
    chatId: str  # noqa: N815
    senderId: str  # noqa: N815
    direction: str
    type: str = "text"
    body: str | None = None
    timestamp: int
    providerMessageId: str | None = None  # noqa: N815
    channelName: str | None = None  # noqa: N815 - the tenant's channel (number or bot) of the chat
    dropped: str | None = None
    senderName: str | None = None  # noqa: N815


LEDGER_BODY = {
    "requestBody": {
        "required": True,
        "description": "StoredMessage records as a JSON array (`[{...}, {...}]`) or as JSON lines "
        "(one record object a line). Any other shape, such as an object wrapping the records "
        '(`{"records": [...]}`) or one record over several lines, is a 422 naming `body`.',
        "content": {
            "application/json": {"schema": {"type": "array", "items": StoredMessageIn.model_json_schema()}},
            "application/x-ndjson": {"schema": {"type": "string"}},
        },
    }
}


@router.post("ledger", response={202: LedgerOut, **ERRORS}, openapi_extra=LEDGER_BODY)
@requires("bot")
def ledger_push(request: HttpRequest, tenant: str) -> Status:
    """Push a bot's message ledger; every record is validated, then journaled before the answer.

    The body is a JSON array of records or JSON lines (one record object a
    line); any other shape (``{"records": [...]}``) is a 422 naming ``body``.
    422 names the first bad record (``records[3].timestamp``) and nothing is
    written. A record without ``tenantId`` belongs to the token's tenant; one
    naming another tenant is refused. Records are projected by a worker.
    """
    records = services.ledger_parse(request.body)
    return Status(202, services.ledger_push(principal(request).tenant, records))


# -- bot replicas: the inbound feed and fenced replies ----------------------------------------


class BotInboundOut(Schema):
    """An inbound message for a bot. ``chat_id`` is the ledger's ``chatId``; ``handed_off``: a human holds
    the chat (do not answer); ``answered``: this bot's reply to it exists, or an outbound message that is
    no bot reply (an agent's, a ledger record) follows it."""

    id: str
    conversation_id: str
    chat_id: str
    channel: str
    channel_name: str | None
    sender_id: str | None
    sender_name: str | None
    type: str
    text: str | None
    timestamp_ms: int
    handed_off: bool
    answered: bool


class BotInboundPage(Schema):
    """One page of the feed; pass ``next`` as ``after`` (with the same ``since_ms``) for the following one."""

    items: list[BotInboundOut]
    next: str | None = None


class BotInboundParams(CursorParams):
    since_ms: int = Field(..., ge=0, description="only messages (and conversations active) at or after this epoch ms")


class BotReplyIn(BodyIn):
    """A bot replica's answer to one inbound message, fenced by its turn on the chat."""

    conversation_id: str
    in_reply_to: str = Field(..., description="the inbound message's id: one answer per message (idempotency key)")
    text: str
    fence: int = Field(..., description="the fence of the replica's turn on the chat (Coordinator.acquire_turn)")


class BotReplyOut(Schema):
    """The queued reply (``created`` false: another replica answered first; this is that answer)."""

    created: bool
    message: MessageOut


@router.get("bots/{anytext:bot}/inbound", response={200: BotInboundPage, **ERRORS})
@requires("bot")
def bot_inbound(request: HttpRequest, tenant: str, bot: str, params: Query[BotInboundParams]) -> dict[str, Any]:
    """For bot replicas: inbound messages at or after ``since_ms``, conversations newest activity first.

    O(page): one page of the inbox list, stopping at the first conversation older
    than ``since_ms``; each conversation gives at most 20 of its newest 50 messages.
    """
    from botmesh_admin.observability.domain import validate_bot_id

    bot = validate_bot_id(bot)
    principal(request).require_bot(bot)  # a bot token reads only its own bot's feed
    items, cursor = selectors.bot_inbound_page(
        tenant, bot=bot, since_ms=params.since_ms, after=params.after, limit=params.limit
    )
    return {"items": [item.to_json() for item in items], "next": cursor}


@router.post("bots/{anytext:bot}/replies", response={202: BotReplyOut, **WRITE_ERRORS})
@requires("bot")
def bot_reply(request: HttpRequest, tenant: str, bot: str, body: BotReplyIn) -> Status:
    """Queue a bot's answer through the outbox (as an agent's reply, without the handoff).

    One answer per inbound message (``in_reply_to``): a second replica gets the
    first answer back (``created`` false). 409 ``stale_fence`` when ``fence`` is
    older than a fence that already replied in this chat (a replica whose turn was
    taken over), 409 ``handed_off`` while a human holds the chat.
    """
    from botmesh_admin.observability.domain import validate_bot_id

    bot = validate_bot_id(bot)
    principal(request).require_bot(bot)  # a bot token answers only as its own bot
    message, created = replies.bot_reply_create(
        tenant,
        body.conversation_id,
        bot=bot,
        in_reply_to=body.in_reply_to,
        text=body.text,
        fence=body.fence,
    )
    return Status(202, {"created": created, "message": message_out(message)})
