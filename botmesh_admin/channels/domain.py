"""Channel value types: normalised inbound events, outbound messages and send results.

Inbound events are what the webhook views journal (one envelope per raw webhook
body, ``payload = {"config": name, "events": [event.to_json(), ...]}``), so every
type round-trips through JSON: ``event_from_json(e.to_json()) == e``.

Identifiers follow the bot ledger (``StoredMessage.chatId``), so a conversation
fed by a webhook and by a bot's ledger push is the same conversation:

- ``chat_key``: ``"whatsapp:<wa_id>"``; ``"telegram:<chat id>"`` for a private
  chat; ``"telegram:<chat id>:<user id>"`` in a group or supergroup (one
  conversation per participant).
- ``sender_id``: ``"whatsapp:<wa_id>"`` / ``"telegram:<user id>"``.
- ``provider_message_id``: the WhatsApp ``wamid``; for Telegram, whose message
  ids are unique only inside one bot's chat, ``"<bot channel name>:<chat id>:<message id>"``.
- ``channel_name``: the tenant's channel configuration that received the event
  (the WhatsApp number by ``metadata.phone_number_id``, the Telegram bot by its
  webhook URL). A conversation is ``(channel_name, chat_key)``: one customer
  writing to two numbers or two bots has two conversations.

Times are epoch milliseconds (``timestamp_ms``).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Literal

from botmesh_admin.errors import BadType, ValidationError
from botmesh_admin.jsonbody import json_type

CHANNEL_KINDS = ("whatsapp", "telegram")
MESSAGE_TYPES = (
    "text",
    "image",
    "video",
    "audio",
    "document",
    "sticker",
    "location",
    "contacts",
    "reaction",
    "button",
    "unsupported",
)
STATUSES = ("sent", "delivered", "read", "failed")
MAX_TEXT = 4096  # Telegram's sendMessage limit; WhatsApp allows 4096 too.
EARLIEST_MESSAGE_MS = 946_684_800_000  # 2000-01-01T00:00:00Z; anything older is a unit or parsing mistake
MAX_CLOCK_SKEW_MS = 86_400_000  # a sender's clock may run a day ahead, no more


def message_time_ms(value: object, field: str, *, unit_ms: int = 1) -> int:
    """Return the time of a message as epoch milliseconds; raise ``ValidationError`` naming ``field``.

    ``value`` must be an integer count of ``unit_ms`` milliseconds since the epoch
    (1000 for providers that send Unix seconds) between 2000-01-01 and a day from
    now: a time that cannot be read is refused, never stored as 1970.
    """
    if value is None:
        raise BadType(field, "is missing: it must be an integer epoch time")
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadType(field, f"must be an integer epoch time, not a {json_type(value)}")
    at_ms = value * unit_ms
    if not EARLIEST_MESSAGE_MS <= at_ms <= time.time_ns() // 1_000_000 + MAX_CLOCK_SKEW_MS:
        unit = "milliseconds" if unit_ms == 1 else "seconds"
        raise ValidationError(field, f"must be epoch {unit} between 2000-01-01 and a day from now")
    return at_ms


@dataclass(frozen=True)
class Media:
    """An attachment: the provider's media/file ``id`` (download it later with the access token)."""

    id: str
    mime_type: str | None = None
    caption: str | None = None
    filename: str | None = None
    size_bytes: int | None = None
    width: int | None = None
    height: int | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class Reaction:
    """An emoji reaction to ``target_message_id``; ``emoji`` is ``""`` when the reaction was removed."""

    target_message_id: str
    emoji: str


@dataclass(frozen=True)
class Button:
    """A button press: WhatsApp ``button_reply`` / ``list_reply`` / template quick reply, Telegram callback.

    ``id`` is the payload the bot defined (Telegram ``callback_data``); ``title`` the label the user saw.
    """

    id: str
    title: str | None = None
    kind: str = "button_reply"
    description: str | None = None


@dataclass(frozen=True)
class Location:
    """A shared location (degrees)."""

    latitude: float
    longitude: float
    name: str | None = None
    address: str | None = None


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


class _Event:
    kind: ClassVar[str]
    _nested: ClassVar[dict[str, type]] = {}

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-serialisable dict (with ``kind``) that ``event_from_json`` reads back."""
        # Not dataclasses.asdict: its deep copy costs more than parsing the webhook.
        data = {name: getattr(self, name) for name in _field_names(type(self))}
        for name, nested in self._nested.items():
            value = data[name]
            if value is not None:
                data[name] = {n: getattr(value, n) for n in _field_names(nested)}
        data["kind"] = self.kind
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Any:
        """Build the event from ``to_json()`` output (unknown keys are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        values: dict[str, Any] = {}
        for key, value in data.items():
            if key not in names:
                continue
            nested = cls._nested.get(key)
            values[key] = nested(**value) if nested is not None and value is not None else value
        return cls(**values)


@dataclass(frozen=True)
class InboundMessage(_Event):
    """A message a user sent to the bot.

    ``type`` is one of ``MESSAGE_TYPES``; ``raw_type`` keeps the provider's own type
    (``interactive``, ``photo``, ``callback_query``, ``bot_command``…). ``text`` is
    what a human reads: the body, a media caption or a button title. ``reply_to``
    is the message this one answers (WhatsApp ``context.id``, Telegram
    ``reply_to_message`` or the message a callback button belongs to).
    ``edit_of`` is set on an edit and names the edited message, whose new text is ``text``.
    """

    kind: ClassVar[str] = "message"
    _nested: ClassVar[dict[str, type]] = {
        "media": Media,
        "reaction": Reaction,
        "button": Button,
        "location": Location,
    }

    channel: str
    chat_key: str
    sender_id: str
    provider_message_id: str
    type: str
    text: str | None = None
    timestamp_ms: int = 0
    sender_name: str | None = None
    media: Media | None = None
    reply_to: str | None = None
    reaction: Reaction | None = None
    button: Button | None = None
    location: Location | None = None
    edit_of: str | None = None
    raw_type: str | None = None
    channel_name: str | None = None


@dataclass(frozen=True)
class StatusUpdate(_Event):
    """A delivery status of a message the bot sent (``sent`` < ``delivered`` < ``read``; ``failed`` is final).

    ``recipient`` is the provider's id of the recipient (WhatsApp ``recipient_id``,
    e.g. ``573001112233``) and ``chat_key`` the matching conversation key.
    """

    kind: ClassVar[str] = "status"

    channel: str
    provider_message_id: str
    status: str
    timestamp_ms: int
    error_code: int | None = None
    error_title: str | None = None
    recipient: str | None = None
    chat_key: str | None = None
    channel_name: str | None = None


@dataclass(frozen=True)
class MemberUpdate(_Event):
    """The bot's membership in a chat changed: Telegram ``my_chat_member``.

    ``status`` is Telegram's new status (``member``, ``kicked``, ``left``…);
    ``kicked`` in a private chat means the user blocked the bot (see ``blocked``).
    ``sender_id`` is the user who made the change.
    """

    kind: ClassVar[str] = "member"

    channel: str
    chat_key: str
    status: str
    timestamp_ms: int
    sender_id: str | None = None
    previous_status: str | None = None
    channel_name: str | None = None

    @property
    def blocked(self) -> bool:
        """Return True if the user blocked (or removed) the bot."""
        return self.status in ("kicked", "left")


InboundEvent = InboundMessage | StatusUpdate | MemberUpdate
_EVENT_TYPES: dict[str, type[_Event]] = {c.kind: c for c in (InboundMessage, StatusUpdate, MemberUpdate)}


def event_from_json(data: dict[str, Any]) -> InboundEvent:
    """Return the event serialised by ``to_json()``; raise ``ValidationError`` for an unknown ``kind``."""
    cls = _EVENT_TYPES.get(data.get("kind", ""))
    if cls is None:
        raise ValidationError("event.kind", f"must be one of {', '.join(_EVENT_TYPES)}")
    return cls.from_json(data)  # type: ignore[no-any-return]


# --- outbound -------------------------------------------------------------------


@dataclass(frozen=True)
class Template:
    """A WhatsApp message template: ``name``, ``language`` code and body ``parameters`` (in order)."""

    name: str
    language: str = "en_US"
    parameters: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not 1 <= len(self.name) <= 512:
            raise ValidationError("message.template.name", "must be 1-512 characters")
        if not isinstance(self.language, str) or not 2 <= len(self.language) <= 15:
            raise ValidationError("message.template.language", "must be a language code like en_US")
        for i, param in enumerate(self.parameters):
            if not isinstance(param, str):
                raise BadType(f"message.template.parameters[{i}]", "must be a string")


@dataclass(frozen=True)
class OutboundMessage:
    """One message to send: exactly one of ``text`` or ``template``.

    ``chat_key`` is a conversation key (``whatsapp:573001112233``,
    ``telegram:700000001``, ``telegram:<group>:<user>``) or a bare provider
    address (``+57 300 111 2233``, ``700000001``). ``idempotency_key`` identifies
    the send in the outbox; HTTP providers pass it as an ``Idempotency-Key`` header.
    """

    chat_key: str
    text: str | None = None
    template: Template | None = None
    idempotency_key: str | None = None
    reply_to: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.chat_key, str) or not self.chat_key.strip():
            raise ValidationError("message.chat_key", "must not be empty")
        if len(self.chat_key) > 200:
            raise ValidationError("message.chat_key", "longer than 200 characters")
        if (self.text is None) == (self.template is None):
            raise ValidationError("message.text", "give exactly one of text or template")
        if self.text is not None:
            if not isinstance(self.text, str):
                raise BadType("message.text", "must be a string")
            if not self.text.strip():
                raise ValidationError("message.text", "must not be blank")
            if len(self.text) > MAX_TEXT:
                raise ValidationError("message.text", f"longer than {MAX_TEXT} characters")
        if self.template is not None and not isinstance(self.template, Template):
            raise BadType("message.template", "must be a Template")
        if self.idempotency_key is not None and not 1 <= len(self.idempotency_key) <= 200:
            raise ValidationError("message.idempotency_key", "must be 1-200 characters")


class SendOutcome(StrEnum):
    """What a provider's answer to one send means, whichever provider gave it.

    ``accepted``; ``rate_limited`` (slow down: retry after ``retry_after_s``);
    ``blocked`` (the user blocked the bot: Telegram 403); ``window_closed``
    (WhatsApp 131047: the 24-hour customer-service window is closed, only a
    template goes); ``bad_credentials`` (the channel's token is refused:
    WhatsApp 190, Telegram 401 — every further send fails too); ``no_answer``
    (no HTTP answer: the provider may or may not have the message, never
    resend it blindly); ``failed`` (any other refusal; ``retryable`` says if a
    retry may succeed).
    """

    ACCEPTED = "accepted"
    RATE_LIMITED = "rate_limited"
    BLOCKED = "blocked"
    WINDOW_CLOSED = "window_closed"
    BAD_CREDENTIALS = "bad_credentials"
    NO_ANSWER = "no_answer"
    FAILED = "failed"


# The one table of provider error codes (ARCHITECTURE §7). WhatsApp: the Cloud API ``error.code``
# (https://developers.facebook.com/docs/whatsapp/cloud-api/support/error-codes), or the HTTP
# status when the answer has no error object. Telegram: the Bot API ``error_code`` (the HTTP
# status; https://core.telegram.org/bots/api#making-requests).
WHATSAPP_RATE_LIMIT_CODES = frozenset(
    {
        4,  # API Too Many Calls (app-level rate limit)
        80007,  # Rate limit issues (WhatsApp Business Account)
        130429,  # Rate limit hit: Cloud API throughput reached
        131048,  # Spam rate limit hit: too many messages of this number blocked or reported
        131056,  # (Business Account, Consumer Account) pair rate limit hit
    }
)
WHATSAPP_RETRYABLE_CODES = WHATSAPP_RATE_LIMIT_CODES | frozenset(
    {
        1,  # API Unknown (possible server error)
        2,  # API Service: temporary downtime or overload
        131000,  # Something went wrong
        133004,  # Server temporarily unavailable
    }
)
OUTCOME_OF_CODE: dict[str, dict[int, SendOutcome]] = {
    "whatsapp": {
        131047: SendOutcome.WINDOW_CLOSED,  # Re-engagement message: over 24 h since the customer last wrote
        190: SendOutcome.BAD_CREDENTIALS,  # Access token has expired (or was invalidated)
        429: SendOutcome.RATE_LIMITED,  # an HTTP 429 without an error object
        **dict.fromkeys(WHATSAPP_RATE_LIMIT_CODES, SendOutcome.RATE_LIMITED),
        # 131026 (Message undeliverable: no WhatsApp account, an old app, terms not accepted) and
        # 131049 (not delivered "to maintain healthy ecosystem engagement": a per-user marketing
        # limit) are ``failed``: WhatsApp never says a user blocked a business, so neither denies consent.
    },
    "telegram": {
        403: SendOutcome.BLOCKED,  # Forbidden: bot was blocked by the user (or kicked from the group)
        401: SendOutcome.BAD_CREDENTIALS,  # Unauthorized: the bot token is wrong or revoked
        429: SendOutcome.RATE_LIMITED,  # Too Many Requests: retry after parameters.retry_after seconds
    },
}
SEND_HINTS: dict[int, str] = {
    131047: "24-hour window closed: the customer must write first, or send a template",
    131026: "undeliverable: not a WhatsApp number, or the customer's app is old or has not accepted the terms",
    131049: "WhatsApp held it back to limit marketing to this customer: try again later, not at once",
    131048: "rate limited by WhatsApp: too many messages from this number were blocked or reported",
    131056: "too many messages to this customer in a short time: try again later",
    403: "the user blocked the bot",
    400: "chat not found",
    130429: "rate limited by WhatsApp",
    429: "rate limited",
    190: "the access token expired",
    401: "the bot token was refused",
}
"""The human hint an agent reads beside a provider's error code (the code is what the inbox stores)."""
OUTCOME_HINTS = {
    SendOutcome.RATE_LIMITED: "rate limited",
    SendOutcome.BLOCKED: "the user blocked the bot",
    SendOutcome.WINDOW_CLOSED: SEND_HINTS[131047],
    SendOutcome.BAD_CREDENTIALS: "the channel's credentials were refused",
    SendOutcome.NO_ANSWER: "no answer from the provider: it may or may not have been delivered",
}


def send_outcome(channel: str, *, status: str, error_code: int | None, retryable: bool) -> SendOutcome:
    """Return what a send answer means: ``channel`` is ``whatsapp``/``telegram`` (another: only the generic rules).

    ``status`` ``accepted`` is ``ACCEPTED``; a failure without a code that may
    be retried is ``NO_ANSWER`` (a network error: nothing came back); a code in
    ``OUTCOME_OF_CODE[channel]`` is its outcome; any other 429 is
    ``RATE_LIMITED``; the rest ``FAILED``.
    """
    if status == "accepted":
        return SendOutcome.ACCEPTED
    if error_code is None:
        return SendOutcome.NO_ANSWER if retryable else SendOutcome.FAILED
    outcome = OUTCOME_OF_CODE.get(channel, {}).get(error_code)
    if outcome is not None:
        return outcome
    return SendOutcome.RATE_LIMITED if error_code == 429 else SendOutcome.FAILED


def send_hint(error_code: int | None, outcome: SendOutcome | None = None) -> str:
    """Return the human hint of a provider error ``error_code`` (else of ``outcome``), ``""`` when there is none."""
    if error_code is not None and error_code in SEND_HINTS:
        return SEND_HINTS[error_code]
    return OUTCOME_HINTS.get(outcome, "") if outcome is not None else ""


def blocked_identity(chat_key: str) -> str | None:
    """Return the address of the user a ``BLOCKED`` answer to ``chat_key`` is about, or ``None``.

    A private chat (``telegram:700000001``) is the user: ``"700000001"``. In a
    group (``telegram:<group id>:<user id>``) a Telegram 403 means the bot was
    removed from the group, not that this user blocked it: ``None``.
    """
    channel, _, address = chat_key.partition(":")
    if not address or ":" in address:
        return None
    return "+" + address if channel == "whatsapp" and address.isdigit() else address


@dataclass(frozen=True)
class SendResult:
    """What a provider answered for one ``OutboundMessage``.

    ``status`` is ``accepted`` or ``failed``; ``outcome`` says what the answer
    means (``SendOutcome``; when not given it is derived from the channel of
    ``chat_key``, ``status``, ``error_code`` and ``retryable`` by
    ``send_outcome``, so every reader reads the same meaning). Accepted:
    ``provider_message_id`` and ``recipient``, the canonical id as the provider
    answers it (WhatsApp ``wa_id`` ``573001112233`` for the input ``+57 300 111
    2233``); ``chat_key`` echoes the message's, so a result is matched to its
    recipient whatever the provider answers. Failed: ``error_code`` (provider
    code, or HTTP status), ``error_title`` (the provider's words),
    ``retryable`` and, when a retry is due after a delay, ``retry_after_ms``
    (``retry_after_s`` is the same delay in seconds). ``hint`` is the human hint
    an agent reads (given, else ``send_hint``; ``""`` when there is none).
    """

    status: Literal["accepted", "failed"]
    chat_key: str
    provider_message_id: str | None = None
    recipient: str | None = None
    error_code: int | None = None
    error_title: str | None = None
    retryable: bool = False
    retry_after_ms: int | None = None
    outcome: SendOutcome | None = None  # never None once built: derived in __post_init__ when not given
    hint: str = ""  # derived in __post_init__ when not given
    retry_after_s: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        outcome = self.outcome
        if outcome is None:
            outcome = send_outcome(
                self.chat_key.partition(":")[0],
                status=self.status,
                error_code=self.error_code,
                retryable=self.retryable,
            )
        object.__setattr__(self, "outcome", SendOutcome(outcome))
        if self.retry_after_ms is not None:
            object.__setattr__(self, "retry_after_s", self.retry_after_ms / 1000)
        if not self.hint and self.status == "failed":
            object.__setattr__(self, "hint", send_hint(self.error_code, self.outcome))

    @property
    def accepted(self) -> bool:
        """Return True if the provider accepted the message."""
        return self.status == "accepted"

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-serialisable dict (for the outbox record)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SendResult:
        """Build a result from ``to_json()`` output (``retry_after_s`` is derived again)."""
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        return cls(**{k: v for k, v in data.items() if k in names})


# --- configuration --------------------------------------------------------------

ENCRYPTED_SECRETS = ("app_secret", "access_token", "bot_token")
HASHED_SECRETS = ("verify_token", "webhook_secret")
SECRETS_OF_KIND = {
    "whatsapp": ("app_secret", "verify_token", "access_token"),
    "telegram": ("bot_token", "webhook_secret"),
}
PUBLIC_OF_KIND = {
    "whatsapp": ("phone_number_id", "display_phone_number"),
    "telegram": ("bot_username",),
}
SECRET_LABELS = {
    "app_secret": "App secret",
    "verify_token": "Verify token",
    "access_token": "Access token",
    "bot_token": "Bot token",
    "webhook_secret": "Webhook secret token",
}


@dataclass(frozen=True)
class Channel:
    """A tenant's channel configuration, as selectors return it.

    Secrets stay sealed (encrypted or hashed) inside ``sealed``, which is left out
    of ``repr`` and comparisons: ask ``is_set(name)``, ``secret(name)`` for an
    encrypted one (decrypted on demand) or ``check(name, value)`` for a hashed one.
    """

    tenant: str
    kind: str
    name: str
    phone_number_id: str | None = None
    display_phone_number: str | None = None
    bot_username: str | None = None
    api_base_url: str | None = None
    updated_at_ms: int = 0
    sealed: dict[str, str] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    # Decrypted values, kept as long as this object: the webhooks' cached copy
    # (seconds) checks a signature per request, and MultiFernet costs ~40 µs a call.
    _clear: dict[str, str] = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    def is_set(self, secret: str) -> bool:
        """Return True if the secret named ``secret`` has a stored value."""
        return bool(self.sealed.get(secret))

    def secret(self, secret: str) -> str | None:
        """Return the clear value of an encrypted secret (``app_secret``, ``access_token``, ``bot_token``)."""
        if secret not in ENCRYPTED_SECRETS:
            raise ValueError(f"{secret} is hashed, not encrypted: use check()")
        from .credentials import decrypt

        stored = self.sealed.get(secret)
        if not stored:
            return None
        if secret not in self._clear:
            self._clear[secret] = decrypt(stored)
        return self._clear[secret]

    def check(self, secret: str, value: str | None) -> bool:
        """Return True if ``value`` matches a hashed secret (``verify_token``, ``webhook_secret``)."""
        if secret not in HASHED_SECRETS:
            raise ValueError(f"{secret} is encrypted, not hashed")
        from .credentials import secret_matches

        return secret_matches(value, self.sealed.get(secret))

    @property
    def secrets_set(self) -> dict[str, bool]:
        """Return ``{secret name: is set}`` for this kind's secrets (what the UI shows: "set ✓")."""
        return {name: self.is_set(name) for name in SECRETS_OF_KIND[self.kind]}
