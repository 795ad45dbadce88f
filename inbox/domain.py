"""Inbox value types, their validation and their JSON form (ARCHITECTURE §5, inbox).

A *conversation* is one chat of one tenant on one of its channel
configurations: ``(channel_name, chat_key)``, where ``channel_name`` is the
tenant's WhatsApp number or Telegram bot that received it and ``chat_key`` the
key the bot ledger and the channel webhooks share (``whatsapp:573001112233``,
``telegram:700000001``, ``telegram:<group>:<user>``). A customer who writes to
two numbers (or two bots) has two conversations, and each is answered through
its own channel. Conversations stored before they belonged to a channel have
``channel_name`` ``None`` until ``manage.py botmesh_assign_channels`` assigns
them, and stay stored under their chat key alone (``keyed_by_chat_only``). Its *messages* come from
the bot's ledger (``StoredMessage``), from channel webhooks and from agents'
replies; they are ordered by ``(timestamp_ms, id)``.

Two version numbers, on purpose:

- ``Conversation.version`` is the *agent-facing* version: it changes when the
  assignee, status, handoff or blocked flag changes, and is what
  ``conversation_assign(..., expected_version=)`` compares. A customer writing
  again does not make an agent's assign fail.
- ``revision`` (conversation, message, read marker) is the store's own version,
  used by services for compare-and-set of whole records.

Times are epoch milliseconds (``*_ms``).
"""

from __future__ import annotations

import functools
import hashlib
import re
import secrets
import threading
import unicodedata
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, is_dataclass, replace
from typing import Any

from botmesh_admin.channels.domain import CHANNEL_KINDS, message_time_ms
from botmesh_admin.clock import now_ms as now_ms  # re-exported: the kernel clock (use_clock in tests)
from botmesh_admin.errors import BadType, ValidationError

DIRECTIONS = ("in", "out")
CONVERSATION_STATUSES = ("open", "pending", "resolved")
# WhatsApp delivery statuses only move forward; ``failed`` is final (Cloud API, "Status messages").
DELIVERY_RANK = {"sent": 1, "delivered": 2, "read": 3, "failed": 4}
REPLY_STATES = ("queued", "sending", "accepted", "failed", "not_confirmed")
SOURCES = ("ledger", "webhook", "agent", "bot")  # bot: a reply a bot sent through the admin
MAX_ID = 200
# The longest Kv key holding an id is ``m/<conversation id>/<13 digit ms>/<id>`` (40 bytes + the id)
# and a key is at most 512 UTF-8 bytes (``botmesh_admin.kv.validation.validate_key``): 200
# characters of 4 bytes each would not fit, so an id is bounded in bytes too.
MAX_ID_BYTES = 400
MAX_TEXT = 65536
MAX_REPLY = 4096
MAX_NOTE = 4000
MAX_PREVIEW = 140
MAX_EDITS = 20
AGENT_RE = re.compile(r"^[A-Za-z0-9_.@+-]{1,150}$")
CHANNEL_RE = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
TYPE_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
CONVERSATION_ID_RE = re.compile(r"^cv_[0-9a-f]{20}$")
# What an agent types may not hold C0/C1 controls other than tab and line feed, nor the bidi
# embeddings, overrides and isolates (Unicode UAX #9) that make text read differently from
# what it says ("Trojan Source", CVE-2021-42574).
TYPED_TEXT_FORBIDDEN_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
# Telegram chat ids (negative for groups), then the user id in a group (see channels.telegram.chat_key).
TELEGRAM_CHAT_RE = re.compile(r"^telegram:-?[0-9]{1,20}(:[0-9]{1,20})?$")
MAX_MS = 2**53
TICK_EVERY_S = 60
"""The period of ``inbox.tick`` in seconds: how late a snoozed conversation may reach the ``open`` list and counts."""


def new_conversation_id() -> str:
    """Return a fresh conversation id: ``cv_`` + 20 hex digits (a new id after each erasure)."""
    return f"cv_{secrets.token_hex(10)}"


_sequence_lock = threading.Lock()
_sequence = [0, 0]  # last ms, counter within that ms


def reply_id(tenant: str, conversation_id: str, idempotency_key: str) -> str:
    """Return the message id of the reply queued with ``idempotency_key``: ``r_`` + 24 hex digits.

    The same key in the same conversation names the same reply (a client's retry).
    """
    digest = hashlib.sha256(f"{tenant}/{conversation_id}/{idempotency_key}".encode()).hexdigest()
    return f"r_{digest[:24]}"


def bot_reply_id(tenant: str, conversation_id: str, *, bot: str, in_reply_to: str) -> str:
    """Return the message id of ``bot``'s reply to the inbound message ``in_reply_to`` (one reply per message)."""
    return reply_id(tenant, conversation_id, f"bot:{bot}:{in_reply_to}")


def new_note_id(at_ms: int) -> str:
    """Return a note id that sorts by creation time: ``n_<13 digit ms>_<4 digit seq><4 hex>``.

    The sequence keeps ids of one process in creation order inside one millisecond.
    """
    with _sequence_lock:
        _sequence[1] = _sequence[1] + 1 if _sequence[0] == at_ms else 0
        _sequence[0] = at_ms
        seq = _sequence[1]
    return f"n_{at_ms:013d}_{seq:04d}{secrets.token_hex(2)}"


def new_reply_id(at_ms: int) -> str:
    """Return an agent reply's message id: ``r_<13 digit ms>_<8 hex>``."""
    return f"r_{at_ms:013d}_{secrets.token_hex(4)}"


def conversation_identity(chat_key: str, channel_name: str | None) -> str:
    """Return the identity a conversation is stored under: ``<channel name>|<chat key>``.

    ``channel_name`` ``None`` (a chat from before conversations belonged to a
    channel, or a ledger record that names no channel of a tenant with several)
    is the chat key alone. Channel names never hold ``|`` (``validate_id``).
    """
    return chat_key if channel_name is None else f"{channel_name}|{chat_key}"


def chat_hash(chat_key: str) -> str:
    """Return the index key of a chat key (so raw chat ids never appear in store keys)."""
    return hashlib.sha256(chat_key.encode()).hexdigest()[:32]


def sort_key(timestamp_ms: int, message_id: str) -> str:
    """Return the key that orders a conversation's messages: ``<13 digit ms>/<id>``."""
    return f"{timestamp_ms:013d}/{message_id}"


def preview(text: str | None) -> str | None:
    """Return ``text`` cut to ``MAX_PREVIEW`` characters for list rows."""
    if text is None:
        return None
    text = " ".join(text.split())
    return text if len(text) <= MAX_PREVIEW else text[: MAX_PREVIEW - 1] + "…"


# -- field validators ------------------------------------------------------------


# What no store keeps: NUL and lone surrogates (refused in typed input, replaced in received text).
_UNSTORABLE_RE = re.compile("[\x00\ud800-\udfff]")


def validate_storable_text(value: object, field: str, *, max_len: int, required: bool = False) -> str | None:
    """Return ``value`` (a string of at most ``max_len`` characters, or ``None`` unless required).

    Raise ``BadType`` for a non-string, ``ValidationError`` naming ``field`` for
    ``None`` or blank text when ``required`` ("is required", "must not be
    blank"), for text over ``max_len`` and for NUL or a lone surrogate (what no
    store keeps). Other control and format characters pass: this holds what
    customers and bots sent. Not the kernel's ``botmesh_admin.validation.validate_text``
    on purpose: that family refuses ``None`` as a type, words blank text "must
    not be empty", and refuses every control and ``SPOOFING_RE`` character with
    other messages, so the inbox's messages (which its tests assert) would change.
    """
    if value is None:
        if required:
            raise ValidationError(field, "is required")
        return None
    if not isinstance(value, str):
        raise BadType(field, f"must be a string, not {type(value).__name__}")
    if required and not value.strip():
        raise ValidationError(field, "must not be blank")
    if len(value) > max_len:
        raise ValidationError(field, f"longer than {max_len} characters")
    if _UNSTORABLE_RE.search(value):
        raise ValidationError(field, "contains NUL or a lone surrogate")
    return value


def received_text(value: str | None, max_len: int) -> str | None:
    """Return what a customer sent, made storable: NUL and lone surrogates become U+FFFD, and
    text over ``max_len`` characters is cut with a visible note of how much was cut.

    For channel input, which must never be lost for its content: the provider
    already delivered it, and refusing it would only dead-letter the message.
    """
    if value is None:
        return None
    value = _UNSTORABLE_RE.sub("\ufffd", value)
    if len(value) <= max_len:
        return value
    note = f" … [{len(value) - max_len + 64} more characters not shown]"
    return value[: max_len - 64] + note[:64]


def validate_typed_text(value: object, field: str, *, max_len: int, required: bool = False) -> str | None:
    """Return ``value`` if ``validate_storable_text`` accepts it and it holds no control or bidi override character.

    For what agents type (notes, replies). A line break must be a line feed:
    pass form input through ``unify_line_breaks`` first. The refusal names the
    character (``contains U+202E RIGHT-TO-LEFT OVERRIDE, a control or bidi override character``); the
    kernel family's ``SPOOFING_RE`` refuses a wider set with another message, so
    this check stays local (see ``validate_storable_text``).
    """
    text = validate_storable_text(value, field, max_len=max_len, required=required)
    found = TYPED_TEXT_FORBIDDEN_RE.search(text or "")
    if found:
        # named as the kernel's checks name one (``U+202E RIGHT-TO-LEFT OVERRIDE``); a control has no name
        name = unicodedata.name(found.group(), "")
        named = f"U+{ord(found.group()):04X}{' ' + name if name else ''}"
        raise ValidationError(field, f"contains {named}, a control or bidi override character")
    return text


def unify_line_breaks(value: str) -> str:
    """Return ``value`` with CR LF and lone CR (what browsers send from a textarea) as LF."""
    return value.replace("\r\n", "\n").replace("\r", "\n") if isinstance(value, str) else value


def validate_storable_id(value: object, field: str) -> str:
    """Return ``value`` if it is an id: 1..200 printable characters (at most 400 UTF-8 bytes) without
    spaces or ``/``; else raise ``ValidationError`` naming ``field``."""
    if not isinstance(value, str):
        raise BadType(field, f"must be a string, not {type(value).__name__}")
    if not 0 < len(value) <= MAX_ID:
        raise ValidationError(field, f"must be 1..{MAX_ID} characters")
    if not value.isascii() and len(value.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES:
        raise ValidationError(field, f"must be at most {MAX_ID_BYTES} bytes in UTF-8")
    if not value.isprintable() or any(c.isspace() or c == "/" for c in value):
        raise ValidationError(field, "must be printable characters without spaces or '/'")
    return value


def _bounded_int(value: object, field: str, what: str, out_of_range: str) -> int:
    """Return ``value`` if it is an int (not a bool) with ``0 <= value < 2**53``, else raise naming ``field``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadType(field, f"must be {what}, not {type(value).__name__}")
    if not 0 <= value < MAX_MS:
        raise ValidationError(field, out_of_range)
    return value


def validate_conversation_version(value: object, field: str) -> int:
    """Return ``value`` if it can be a conversation version (a whole number, 0 <= v < 2**53)."""
    return _bounded_int(
        value,
        field,
        "the conversation's version (a whole number)",
        "must be the conversation's version, as the conversation shows it",
    )


def validate_ms(value: object, field: str) -> int:
    """Return ``value`` if it is epoch milliseconds (a non-negative int below 2**53)."""
    return _bounded_int(value, field, "an integer of epoch milliseconds", "must be epoch milliseconds (0 <= t < 2**53)")


def validate_agent(value: object, field: str = "agent") -> str:
    """Return ``value`` if it is an agent id (a username: letters, digits and ``_.@+-``)."""
    if not isinstance(value, str):
        raise BadType(field, f"must be a string, not {type(value).__name__}")
    if not AGENT_RE.fullmatch(value):
        raise ValidationError(field, "must be a username (1-150 letters, digits or _.@+-)")
    return value


def validate_choice(value: object, field: str, choices: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``choices``."""
    if value not in choices:
        raise ValidationError(field, f"must be one of {', '.join(choices)}")
    return str(value)


@functools.lru_cache(maxsize=4096)  # a ledger push repeats the same few chats
def _is_wa_id(address: str) -> bool:
    from crm.domain import normalize_identity

    try:
        normalize_identity("whatsapp", "+" + address)
    except ValidationError:
        return False
    return True


def validate_chat_id(channel: str, value: object, field: str) -> str:
    """Return ``value`` if it is a chat key of ``channel`` (see the module doc).

    ``whatsapp:<wa_id>``: the digits of a phone number the CRM accepts, so the
    conversation and the contact agree. ``telegram:<chat id>`` or, in a group,
    ``telegram:<chat id>:<user id>``.
    """
    chat_id = validate_storable_id(value, field)
    prefix, _, address = chat_id.partition(":")
    if prefix != channel:
        raise ValidationError(field, f"must start with '{channel}:' like the record's channel")
    if channel == "whatsapp" and not (address.isascii() and address.isdigit() and _is_wa_id(address)):
        raise ValidationError(field, "must be whatsapp:<wa_id>, the digits of the user's phone number")
    if channel == "telegram" and not TELEGRAM_CHAT_RE.fullmatch(chat_id):
        raise ValidationError(field, "must be telegram:<chat id> or telegram:<chat id>:<user id>")
    return chat_id


def storable_id(value: str | None) -> str | None:
    """Return ``value`` if ``validate_storable_id`` accepts it, else ``None`` (an optional reference dropped)."""
    if value is None:
        return None
    try:
        return validate_storable_id(value, "id")
    except ValidationError:
        return None


def inbound_event_problem(event: Any) -> ValidationError | None:
    """Return why the inbox can never store a channel event (the first id it refuses), or ``None``.

    ``event`` is an ``InboundMessage``, ``StatusUpdate`` or ``MemberUpdate``
    (``botmesh_admin.channels.domain``). The ids that identify what is stored
    must pass ``validate_storable_id``: the message id (``provider_message_id``), the
    sender (``sender_id``, ``"whatsapp:" + from``, so a WhatsApp ``from`` of at
    most 191 characters), the chat (``chat_key``), the message a reaction or an
    edit names, a status's message and chat. Such an event fails projection on
    every attempt, so the webhook skips it (``channels.webhooks``) and projection
    skips one journaled before. So does a WhatsApp or Telegram chat key the
    bots could not name (``validate_chat_id``: a ``from`` that is no phone
    number's digits). A ``reply_to`` that is no id is not a reason:
    the message is stored without it.
    """
    kind = getattr(event, "kind", None)
    fields: list[tuple[str, object]] = []
    if kind == "message":
        fields = [
            ("provider_message_id", event.provider_message_id),
            ("sender_id", event.sender_id),
            ("chat_key", event.chat_key),
        ]
        if event.reaction is not None:
            fields.append(("reaction.target_message_id", event.reaction.target_message_id))
        if event.edit_of is not None:
            fields.append(("edit_of", event.edit_of))
    elif kind == "status":
        fields = [("provider_message_id", event.provider_message_id)]
        if event.chat_key is not None:
            fields.append(("chat_key", event.chat_key))
    elif kind == "member":
        fields = [("chat_key", event.chat_key)]
    for name, value in fields:
        try:
            validate_storable_id(value, f"event.{name}")
            if name == "chat_key":
                # The key the bots' handoff reads and ledger records name (validate_chat_key): a
                # conversation under any other one could never be answered (a WhatsApp ``from``
                # no phone number has, ``12345``, was stored and its handoff refused every minute).
                kind = str(value).partition(":")[0]
                if kind in CHANNEL_KINDS:
                    validate_chat_id(kind, value, f"event.{name}")
        except ValidationError as exc:
            return exc
    return None


CHAT_KEY_FORMAT = "whatsapp:<wa_id> or telegram:<chat id>[:<user id>] (e.g. whatsapp:573001112233)"


def validate_chat_key(value: object, field: str = "chat_id") -> str:
    """Return ``value`` if it is a chat key of one of ``CHANNEL_KINDS``, else raise naming ``field``.

    The key a bot asks about must carry its kind (``whatsapp:573001112233``,
    ``telegram:700000001``, ``telegram:-1001234:700000001``: the ledger's
    ``chatId``, see ``botmesh_admin.channels.domain``); a bare number or a
    foreign prefix is refused so a typo is never answered "not handed off".
    Bounded like other ids (``MAX_ID`` characters).
    """
    chat_id = validate_storable_id(value, field)
    kind, sep, _ = chat_id.partition(":")
    if not sep or kind not in CHANNEL_KINDS:
        raise ValidationError(field, f"must be {CHAT_KEY_FORMAT}")
    return validate_chat_id(kind, chat_id, field)


def validate_conversation_id(value: object, field: str = "conversation_id") -> str:
    """Return ``value`` if it has the shape of a conversation id (``cv_`` + 20 hex digits)."""
    if not isinstance(value, str) or not CONVERSATION_ID_RE.fullmatch(value):
        raise ValidationError(field, "not a conversation id")
    return value


# -- the bot ledger record -------------------------------------------------------


@dataclass(frozen=True)
class StoredMessage:
    """One record of a bot's message ledger, as the bot pushes it (JSON names in brackets).

    ``id`` (``id``) is the bot's message id and the idempotency key;
    ``channel`` (``channel``) one of ``CHANNEL_KINDS``; ``chat_id`` (``chatId``)
    the conversation key of that channel (``validate_chat_id``); ``direction``
    ``in`` (from the user) or ``out`` (from the bot); ``timestamp_ms``
    (``timestamp``) epoch ms, from 2000 to a day from now.
    ``dropped`` (``dropped``) is set by a bot that did *not* send an outbound
    message, with the reason (``handoff`` while a human holds the chat).
    ``channel_name`` (``channelName``, optional) is the tenant's channel the
    chat is on (the number or bot); without it the inbox takes the tenant's only
    channel of that kind, or the chat's conversation without a channel.
    """

    id: str
    tenant_id: str | None
    channel: str
    chat_id: str
    sender_id: str
    direction: str
    type: str
    body: str | None
    timestamp_ms: int
    provider_message_id: str | None = None
    dropped: str | None = None
    sender_name: str | None = None
    channel_name: str | None = None

    @classmethod
    def from_json(cls, data: object, field: str = "record") -> StoredMessage:
        """Validate one ledger record (its JSON object); raise ``ValidationError`` naming ``field.<name>``."""
        if not isinstance(data, Mapping):
            raise BadType(field, "must be a JSON object")
        tenant = data.get("tenantId")
        if tenant is not None:
            from botmesh_admin.kv.tenant import validate_id

            validate_id(tenant, f"{field}.tenantId")
        channel = data.get("channel")
        if channel not in CHANNEL_KINDS:
            raise ValidationError(f"{field}.channel", f"must be one of {', '.join(CHANNEL_KINDS)}")
        direction = data.get("direction")
        validate_choice(direction, f"{field}.direction", DIRECTIONS)
        kind = data.get("type", "text")
        if not isinstance(kind, str) or not TYPE_RE.fullmatch(kind):
            raise ValidationError(f"{field}.type", "must be a message type like text or image")
        dropped = data.get("dropped")
        if dropped is not None and (not isinstance(dropped, str) or not TYPE_RE.fullmatch(dropped)):
            raise ValidationError(f"{field}.dropped", "must be a reason like handoff")
        provider_id = data.get("providerMessageId")
        channel_name = data.get("channelName")
        if channel_name is not None:
            from botmesh_admin.kv.tenant import validate_id

            validate_id(channel_name, f"{field}.channelName")
        return cls(
            id=validate_storable_id(data.get("id"), f"{field}.id"),
            tenant_id=tenant,
            channel=channel,
            chat_id=validate_chat_id(str(channel), data.get("chatId"), f"{field}.chatId"),
            sender_id=validate_storable_id(data.get("senderId"), f"{field}.senderId"),
            direction=str(direction),
            type=kind,
            body=validate_storable_text(data.get("body"), f"{field}.body", max_len=MAX_TEXT),
            timestamp_ms=message_time_ms(data.get("timestamp"), f"{field}.timestamp"),
            provider_message_id=None
            if provider_id is None
            else validate_storable_id(provider_id, f"{field}.providerMessageId"),
            dropped=dropped,
            sender_name=validate_storable_text(data.get("senderName"), f"{field}.senderName", max_len=200),
            channel_name=channel_name,
        )

    def to_json(self) -> dict[str, Any]:
        """Return the ledger JSON form (``from_json(to_json())`` round-trips)."""
        record: dict[str, Any] = {
            "id": self.id,
            "tenantId": self.tenant_id,
            "channel": self.channel,
            "chatId": self.chat_id,
            "senderId": self.sender_id,
            "direction": self.direction,
            "type": self.type,
            "body": self.body,
            "timestamp": self.timestamp_ms,
            "providerMessageId": self.provider_message_id,
        }
        if self.dropped is not None:
            record["dropped"] = self.dropped
        if self.sender_name is not None:
            record["senderName"] = self.sender_name
        if self.channel_name is not None:
            record["channelName"] = self.channel_name
        return record


# -- conversation ----------------------------------------------------------------


@dataclass(frozen=True)
class InboxSettings:
    """What replying means in a tenant (README, "Inbox"); the defaults are what Chatwoot's users expect.

    ``reply_takes_over``: an agent's reply in a chat the bot is handling takes
    the chat from the bot (a handoff by the replier, now; an unassigned
    conversation is assigned to them). False: the bot keeps answering.
    ``reply_to_others``: any agent may reply in a conversation assigned to
    another agent. False: refused (409 naming the assignee) unless the replier
    is an admin or assigns it to themselves in the same action.
    """

    reply_takes_over: bool = True
    reply_to_others: bool = False
    revision: int = 0

    def to_json(self) -> dict[str, Any]:
        """Return the stored JSON form (without ``revision``)."""
        return {"reply_takes_over": self.reply_takes_over, "reply_to_others": self.reply_to_others}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], revision: int) -> InboxSettings:
        """Build settings from ``to_json()`` output (a missing field keeps its default)."""
        return cls(**_known(cls, data), revision=revision)


@dataclass(frozen=True)
class Handoff:
    """Who took the chat from the bot and when; ``active`` False once given back (who/when too)."""

    active: bool
    taken_by: str
    taken_at_ms: int
    released_by: str | None = None
    released_at_ms: int | None = None


@dataclass(frozen=True)
class Conversation:
    """One chat of a tenant. ``version`` is agent-facing, ``revision`` the store's (see module doc).

    ``inbound_count`` counts messages from the user (the base of unread counts);
    ``last_*`` describe the newest message by timestamp (the list row).
    ``snoozed_until_ms``: a ``pending`` conversation that reopens at that time.
    ``channel`` is the kind (whatsapp, telegram), ``channel_name`` the tenant's
    channel configuration that received the chat (see the module doc);
    ``keyed_by_chat_only`` marks a conversation stored under its chat key alone
    (created without a channel; it keeps that key once a channel is assigned).
    """

    id: str
    chat_key: str
    channel: str
    created_at_ms: int
    channel_name: str | None = None
    keyed_by_chat_only: bool = False
    status: str = "open"
    assignee: str | None = None
    version: int = 1
    contact_id: str | None = None
    display_name: str | None = None
    blocked: bool = False
    blocked_at_ms: int | None = None
    blocked_evidence: str | None = None
    handoff: Handoff | None = None
    snoozed_until_ms: int | None = None
    last_activity_ms: int = 0
    last_message_id: str | None = None
    last_text: str | None = None
    last_direction: str | None = None
    last_author: str | None = None  # the agent who wrote the newest message (None: the customer or the bot)
    message_count: int = 0
    inbound_count: int = 0
    last_inbound_ms: int | None = None
    updated_at_ms: int = 0
    revision: int = 0

    @property
    def identity(self) -> str:
        """Return the identity the store keeps this conversation under (``conversation_identity``)."""
        return conversation_identity(self.chat_key, None if self.keyed_by_chat_only else self.channel_name)

    @property
    def handed_off(self) -> bool:
        """Return True while a human holds the chat (the bot must not answer)."""
        return self.handoff is not None and self.handoff.active

    def to_json(self) -> dict[str, Any]:
        """Return the stored JSON form (without ``revision``, which is the store's)."""
        data = _json_of(self)
        data.pop("revision")
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any], revision: int) -> Conversation:
        """Build a conversation from ``to_json()`` output."""
        values = _known(cls, data)
        if values.get("handoff") is not None:
            values["handoff"] = Handoff(**values["handoff"])
        # Stored before conversations belonged to a channel: under the chat key alone.
        values.setdefault("keyed_by_chat_only", True)
        return cls(**values, revision=revision)


def validate_conversation(conversation: Conversation) -> Conversation:
    """Return ``conversation`` if every field is valid, else raise ``ValidationError``."""
    c = conversation
    validate_conversation_id(c.id, "conversation.id")
    validate_storable_id(c.chat_key, "conversation.chat_key")
    if not CHANNEL_RE.fullmatch(c.channel):
        raise ValidationError("conversation.channel", "must be a channel kind")
    if c.channel_name is not None:
        from botmesh_admin.kv.tenant import validate_id

        validate_id(c.channel_name, "conversation.channel_name")
    if c.channel_name is None and not c.keyed_by_chat_only:
        raise ValidationError("conversation.keyed_by_chat_only", "must be set for a conversation without a channel")
    validate_choice(c.status, "conversation.status", CONVERSATION_STATUSES)
    if c.assignee is not None:
        validate_agent(c.assignee, "conversation.assignee")
    validate_storable_text(c.display_name, "conversation.display_name", max_len=200)
    validate_storable_text(c.blocked_evidence, "conversation.blocked_evidence", max_len=500)
    validate_storable_text(c.last_text, "conversation.last_text", max_len=MAX_PREVIEW)
    for name in ("created_at_ms", "last_activity_ms", "updated_at_ms", "message_count", "inbound_count", "version"):
        validate_ms(getattr(c, name), f"conversation.{name}")
    for name in ("snoozed_until_ms", "blocked_at_ms", "last_inbound_ms"):
        if getattr(c, name) is not None:
            validate_ms(getattr(c, name), f"conversation.{name}")
    if c.handoff is not None:
        validate_agent(c.handoff.taken_by, "conversation.handoff.taken_by")
        validate_ms(c.handoff.taken_at_ms, "conversation.handoff.taken_at_ms")
        if c.handoff.released_by is not None:
            validate_agent(c.handoff.released_by, "conversation.handoff.released_by")
    return c


# -- message ---------------------------------------------------------------------


@dataclass(frozen=True)
class MessageReaction:
    """An emoji a user put on a message (one per sender; a newer one replaces it)."""

    sender_id: str
    emoji: str
    at_ms: int


@dataclass(frozen=True)
class Edit:
    """A previous text of an edited message, and when it was replaced."""

    text: str | None
    replaced_at_ms: int


@dataclass(frozen=True)
class Reply:
    """Delivery state of an agent's reply through the outbox.

    ``queued`` → ``sending`` (marked durably before the provider request) →
    ``accepted`` or ``failed`` (``error_code``/``error_title`` shown to the agent).
    ``not_confirmed``: a worker stopped between the request and its answer, so
    nobody knows if it went out; it is never resent automatically (the agent may).
    """

    author: str
    state: str
    idempotency_key: str
    attempts: int = 0
    error_code: int | None = None
    error_title: str | None = None
    retry_at_ms: int | None = None
    updated_at_ms: int = 0


@dataclass(frozen=True)
class Message:
    """One message of a conversation.

    ``type``: text, image, video, audio, document, sticker, location, contacts,
    button, unsupported, ... (``media``/``button``/``location`` hold the details,
    ``text`` what a person reads: body, caption or button title).
    ``status``: provider delivery status of an outbound message (sent < delivered
    < read; failed is final with ``error_code``/``error_title``).
    ``placeholder``: an outbound message known only from a status or a reaction
    (sent outside the inbox), or an inbound one known only from its edit;
    replaced by the full record when it arrives.
    ``aliases``: other ids the same message arrived under (ledger and webhook).
    """

    id: str
    conversation_id: str
    direction: str
    type: str
    timestamp_ms: int
    text: str | None = None
    sender_id: str | None = None
    sender_name: str | None = None
    provider_message_id: str | None = None
    source: str = "ledger"
    status: str | None = None
    status_at_ms: int | None = None
    error_code: int | None = None
    error_title: str | None = None
    reactions: tuple[MessageReaction, ...] = ()
    button: dict[str, Any] | None = None
    media: dict[str, Any] | None = None
    location: dict[str, Any] | None = None
    reply_to: str | None = None
    edits: tuple[Edit, ...] = ()
    dropped: str | None = None
    placeholder: bool = False
    aliases: tuple[str, ...] = ()
    reply: Reply | None = None
    revision: int = 0

    @property
    def sort_key(self) -> str:
        """Return the key that orders this message in its conversation."""
        return sort_key(self.timestamp_ms, self.id)

    @property
    def edited(self) -> bool:
        """Return True if the text was edited (``edits`` keeps the previous texts)."""
        return bool(self.edits)

    def to_json(self) -> dict[str, Any]:
        """Return the stored JSON form (without ``revision``)."""
        data = _json_of(self)
        data.pop("revision")
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any], revision: int) -> Message:
        """Build a message from ``to_json()`` output."""
        values = _known(cls, data)
        values["reactions"] = tuple(MessageReaction(**r) for r in values.get("reactions") or ())
        values["edits"] = tuple(Edit(**e) for e in values.get("edits") or ())
        values["aliases"] = tuple(values.get("aliases") or ())
        if values.get("reply") is not None:
            values["reply"] = Reply(**values["reply"])
        return cls(**values, revision=revision)


def validate_message(message: Message) -> Message:
    """Return ``message`` if every field is valid, else raise ``ValidationError``."""
    m = message
    validate_storable_id(m.id, "message.id")
    validate_conversation_id(m.conversation_id, "message.conversation_id")
    validate_choice(m.direction, "message.direction", DIRECTIONS)
    if not TYPE_RE.fullmatch(m.type):
        raise ValidationError("message.type", "must be a message type like text or image")
    validate_ms(m.timestamp_ms, "message.timestamp_ms")
    validate_storable_text(m.text, "message.text", max_len=MAX_TEXT)
    validate_storable_text(m.sender_name, "message.sender_name", max_len=200)
    for name in ("sender_id", "provider_message_id", "reply_to"):
        if getattr(m, name) is not None:
            validate_storable_id(getattr(m, name), f"message.{name}")
    validate_choice(m.source, "message.source", SOURCES)
    if m.status is not None:
        validate_choice(m.status, "message.status", tuple(DELIVERY_RANK))
    for i, alias in enumerate(m.aliases):
        validate_storable_id(alias, f"message.aliases[{i}]")
    for i, reaction in enumerate(m.reactions):
        validate_storable_text(reaction.emoji, f"message.reactions[{i}].emoji", max_len=32)
    if m.reply is not None:
        validate_choice(m.reply.state, "message.reply.state", REPLY_STATES)
        validate_agent(m.reply.author, "message.reply.author")
    return m


# -- notes and read markers --------------------------------------------------------


@dataclass(frozen=True)
class Note:
    """A private note on a conversation (agents only; never sent to the customer)."""

    id: str
    conversation_id: str
    author: str
    text: str
    created_at_ms: int

    def to_json(self) -> dict[str, Any]:
        """Return the stored JSON form."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Note:
        """Build a note from ``to_json()`` output."""
        return cls(**_known(cls, data))


def conversation_search_keys(display_name: str | None, chat_key: str) -> set[str]:
    """Return the keys a text search finds a conversation by: its contact's name words and its chat's identity.

    The CRM's rule (``crm.domain.search_index_keys``): folded name words
    (``"Ana García"`` → ``ana``, ``garcia``), a WhatsApp number's digits in
    international and national form (``573001112233``, ``3001112233``), a
    Telegram user id. A term matches a key it starts.
    """
    from crm.domain import search_index_keys

    kind, _, address = chat_key.partition(":")
    identities = [(kind, f"+{address}" if kind == "whatsapp" else address)] if address else []
    return search_index_keys(display_name, identities)


EVENT_KINDS = ("assigned", "unassigned", "handoff_taken", "handoff_released", "status")


@dataclass(frozen=True)
class ConversationEvent:
    """A change of a conversation an agent reads in its thread: who did what, when.

    ``kind``: ``assigned`` (``value``: the new assignee), ``unassigned``,
    ``handoff_taken`` / ``handoff_released`` (a human took the chat from the bot
    / gave it back), ``status`` (``value``: open, pending or resolved).
    ``actor``: the agent (a username), or ``None`` for the system (the wake-up
    job reopening a snoozed conversation). ``id`` sorts by time (``new_note_id``'s
    shape with an ``e`` prefix).
    """

    id: str
    conversation_id: str
    kind: str
    at_ms: int
    actor: str | None = None
    value: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the stored JSON form."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ConversationEvent:
        """Build an event from ``to_json()`` output."""
        return cls(**_known(cls, data))


def new_event_id(at_ms: int) -> str:
    """Return an event id that sorts by time: ``e_<13 digit ms>_<4 digit seq><4 hex>``."""
    return "e" + new_note_id(at_ms)[1:]


def conversation_events(
    old: Conversation, new: Conversation, *, actor: str | None, at_ms: int
) -> tuple[ConversationEvent, ...]:
    """Return the events that turn ``old`` into ``new``: assignee, handoff and status changes, in that order.

    Raise ``ValidationError`` naming ``actor`` for a name that is not an agent's.
    """
    if actor is not None:
        validate_agent(actor, "actor")
    out: list[ConversationEvent] = []

    def add(kind: str, value: str | None = None) -> None:
        out.append(ConversationEvent(new_event_id(at_ms), new.id, kind, at_ms, actor, value))

    if new.handed_off != old.handed_off:
        add("handoff_taken" if new.handed_off else "handoff_released")
    if new.assignee != old.assignee:
        add("assigned", new.assignee) if new.assignee is not None else add("unassigned")
    if new.status != old.status:
        add("status", new.status)
    return tuple(out)


def validate_note(note: Note) -> Note:
    """Return ``note`` if valid: text 1..4000 characters, an agent author."""
    validate_typed_text(note.text, "note.text", max_len=MAX_NOTE, required=True)
    validate_agent(note.author, "note.author")
    validate_conversation_id(note.conversation_id, "note.conversation_id")
    validate_ms(note.created_at_ms, "note.created_at_ms")
    return note


@dataclass(frozen=True)
class ReadMarker:
    """The last message ``agent`` read in a conversation (its id and its sort key).

    ``seen_inbound``: how many inbound messages of the conversation sort at or
    before the marker, kept by the store (a late inbound message that sorts
    before the marker adds one), so the agent's unread count is
    ``conversation.inbound_count - seen_inbound`` without reading messages.
    ``None`` on a marker stored before the store kept it (counted by a message
    scan until the store backfills it).
    """

    conversation_id: str
    agent: str
    message_id: str
    message_sort_key: str
    at_ms: int
    revision: int = 0
    seen_inbound: int | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the stored JSON form (without ``revision``)."""
        data = _json_of(self)
        data.pop("revision")
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any], revision: int) -> ReadMarker:
        """Build a marker from ``to_json()`` output."""
        return cls(**_known(cls, data), revision=revision)


def validate_marker(marker: ReadMarker) -> ReadMarker:
    """Return ``marker`` if valid."""
    validate_agent(marker.agent, "marker.agent")
    validate_storable_id(marker.message_id, "marker.message_id")
    validate_conversation_id(marker.conversation_id, "marker.conversation_id")
    return marker


def _json_of(value: Any) -> Any:
    """Return a dataclass value as plain JSON data (what a JSON store keeps: tuples become lists).

    Like ``asdict`` without its deep copies: projection stores a message and its
    conversation per inbound message, and ``asdict`` took over twice as long.
    """
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _json_of(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, dict):
        return {k: _json_of(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_of(v) for v in value]
    return value


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    # Computed once per class: ``fields()`` on every decoded record was a fifth of a list page's time.
    return frozenset(f.name for f in fields(cls)) - {"revision"}


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    names = _field_names(cls)
    return {k: v for k, v in data.items() if k in names}


__all__ = [
    "TICK_EVERY_S",
    "bot_reply_id",
    "reply_id",
    "Conversation",
    "Edit",
    "Handoff",
    "InboxSettings",
    "Message",
    "MessageReaction",
    "Note",
    "ReadMarker",
    "Reply",
    "StoredMessage",
    "replace",
]
