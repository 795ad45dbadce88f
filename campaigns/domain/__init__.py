"""Campaign value types, their validation, and the rules of a send slot (ARCHITECTURE §5, campaigns).

A ``Campaign`` sends one ``Message`` to the members of a CRM segment on one
channel. Its life: ``draft`` → (``scheduled`` →) ``running`` ⇄ ``paused`` →
``completed``; ``cancelled`` and ``failed`` end it early. Times are epoch
**milliseconds**.

Every planned recipient has one ``Delivery`` — its *send slot* — keyed by
(tenant, campaign, recipient). The slot rules live here as pure functions
(``reserve``, ``mark_sending``, ``mark_sent``…), so every store applies exactly
the same transitions inside its own compare-and-set:

=============  ===========================================================
``pending``    planned, not yet taken (or released for a retry after ``not_before``)
``reserved``   taken by a sender until ``lease_until``; the request has not left.
               An expired reservation is taken again (no provider id was recorded).
``sending``    the request is leaving. Never taken again automatically: found
               expired (the sender died) it becomes ``in_doubt``.
``accepted``   the provider accepted it: ``provider_message_id`` (final)
``failed``     the provider refused it: code, title, retryable (final)
``dropped``    not sent, with the reason (consent withdrawn, a send hook…) (final)
``cancelled``  the campaign was cancelled before it was sent (final)
``in_doubt``   the request may have reached the provider but no answer was recorded;
               listed for review, resent only by a person (``resend``)
=============  ===========================================================
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from botmesh_admin.errors import BadType, Conflict, ValidationError
from botmesh_admin.ids import new_id
from botmesh_admin.kv.validation import now_ms as now_ms
from botmesh_admin.validation import validate_text

# --------------------------------------------------------------------------- vocabulary

CAMPAIGN_STATES = ("draft", "scheduled", "running", "paused", "completed", "cancelled", "failed")
ACTIVE_STATES = ("scheduled", "running", "paused")
FINISHED_STATES = ("completed", "cancelled", "failed")
EDITABLE_STATES = ("draft", "scheduled")
CHANNELS = ("whatsapp", "telegram")
RUN_EVENT = "campaigns.run"
"""The journal event type of a campaign's run: ``payload = {"campaign_id": …}`` (``campaigns.handlers``)."""
RUN_CHANNEL = "campaigns-run"
"""The journal channel runs drain on, apart from webhooks and sends (a channel id has no dots)."""

DELIVERY_STATES = (
    "pending",
    "reserved",
    "sending",
    "accepted",
    "failed",
    "dropped",
    "cancelled",
    "in_doubt",
)
OUTCOMES = ("accepted", "failed", "dropped", "cancelled", "in_doubt")
FINAL_STATES = ("accepted", "failed", "dropped", "cancelled")
OPEN_STATES = ("pending", "reserved", "sending")
REASON_STATES = ("failed", "dropped", "cancelled", "in_doubt")
"""The states whose deliveries are also counted per reason (``DeliveryCounts.reasons``)."""

# Why the planner leaves a contact out (counted per reason in the preview).
PLAN_REASONS = ("not_in_segment", "no_identity", "opted_out", "duplicate", "contact_not_found")
# Why a delivery is dropped at send time (a send hook may give its own reason too).
SEND_DROP_REASONS = ("opted_out", "no_identity", "contact_erased")

ID_RE = re.compile(r"^cmp_[0-9a-f]{22}$")
TOKEN_RE = re.compile(r"^[0-9a-f]{16,64}$")
REASON_RE = re.compile(r"^[a-z0-9][a-z0-9_.:-]{0,63}$")
MAX_NAME = 200
MAX_TEXT = 4096
MAX_PARAMETERS = 20
MAX_PARAMETER = 1024
MAX_CONTACT_IDS = 100_000
MAX_RECIPIENT = 200
MIN_RATE, MAX_RATE = 0.1, 1000.0
DEFAULT_MAX_ATTEMPTS = 3


def new_campaign_id() -> str:
    """Return a new campaign id that sorts by creation time: ``cmp_`` + 22 hex digits."""
    return new_id("cmp")


def new_token() -> str:
    """Return a fresh reservation token (32 hex digits)."""
    return secrets.token_hex(16)


def validate_campaign_id(value: object, field: str = "campaign_id") -> str:
    """Return ``value`` if it is a campaign id, else raise ``ValidationError``."""
    if not isinstance(value, str) or not ID_RE.fullmatch(value):
        raise ValidationError(field, "not a campaign id")
    return value


def _text(value: object, field: str, max_len: int, *, required: bool = False) -> str:
    return validate_text(value, field, max_len=max_len, blank=not required, allowed_controls="\t\n\r")


def validate_reason(reason: object, field: str = "reason") -> str:
    """Return a drop/cancel reason: 1-64 characters of a-z, 0-9, ``_ . : -``."""
    if not isinstance(reason, str) or not REASON_RE.fullmatch(reason):
        raise ValidationError(field, "must be 1-64 characters of a-z, 0-9, '_', '.', ':' or '-'")
    return reason


# --------------------------------------------------------------------------- message


@dataclass(frozen=True, slots=True)
class Message:
    """What a campaign sends: a WhatsApp template (name, language, body parameters) or a text.

    ``{name}`` in the text or a parameter is replaced by the contact's name at send time.
    """

    text: str | None = None
    template: str | None = None
    language: str = "en_US"
    parameters: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "template": self.template,
            "language": self.language,
            "parameters": list(self.parameters),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Message:
        return cls(d.get("text"), d.get("template"), d.get("language") or "en_US", tuple(d.get("parameters") or ()))

    def render(self, name: str | None) -> Message:
        """Return the message with ``{name}`` replaced by ``name`` (empty when unknown)."""
        who = name or ""
        return replace(
            self,
            text=self.text.replace("{name}", who) if self.text is not None else None,
            parameters=tuple(p.replace("{name}", who) for p in self.parameters),
        )


TEMPLATE_NAME_RE = re.compile(r"^[a-z0-9_]{1,512}$")
PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
PLACEHOLDERS = ("name",)
"""What ``Message.render`` fills in: ``{name}``, the contact's name."""


def _placeholders_known(text: str, field: str) -> str:
    """Return ``text`` if every ``{word}`` in it is one ``Message.render`` fills in, else raise naming ``field``."""
    for m in PLACEHOLDER_RE.finditer(text):
        if m.group(1) not in PLACEHOLDERS:
            raise ValidationError(field, f"{{{m.group(1)}}} is filled in by nothing: only {{name}} is")
    return text


LANGUAGE_RE = re.compile(r"^[a-z]{2,3}(_[A-Z]{2})?$")


def message_from_input(data: object, channel: str, field: str = "campaign.message") -> Message:
    """Return a validated ``Message`` for ``channel``; raise ``ValidationError`` naming the field.

    WhatsApp marketing messages must be approved templates (a free text is only
    allowed inside the 24-hour customer service window, which a campaign cannot
    count on); Telegram has no templates, so it takes a text.
    """
    if isinstance(data, Message):
        data = data.to_json()
    if not isinstance(data, Mapping):
        raise BadType(field, "must be an object")
    known = {"text", "template", "language", "parameters"}
    for name in data:
        if name not in known:
            raise ValidationError(f"{field}.{name}", f"unknown field; use {', '.join(sorted(known))}")
    text, template = data.get("text"), data.get("template")
    text = None if text is None or (isinstance(text, str) and not text.strip()) else text
    template = None if template is None or (isinstance(template, str) and not template.strip()) else template
    if channel == "whatsapp":
        if template is None:
            raise ValidationError(f"{field}.template", "a WhatsApp campaign needs an approved template name")
        if text is not None:
            raise ValidationError(f"{field}.text", "a WhatsApp campaign sends a template, not a text")
        template = _text(template, f"{field}.template", 512).strip()
        if not TEMPLATE_NAME_RE.fullmatch(template):
            raise ValidationError(f"{field}.template", "template names are lower-case letters, digits and _")
        language = data.get("language") or "en_US"
        if not isinstance(language, str) or not LANGUAGE_RE.fullmatch(language):
            raise ValidationError(f"{field}.language", "must be a language code like en_US or es")
        raw = data.get("parameters") or ()
        if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence):
            raise BadType(f"{field}.parameters", "must be a list of strings")
        if len(raw) > MAX_PARAMETERS:
            raise ValidationError(f"{field}.parameters", f"more than {MAX_PARAMETERS} parameters")
        params = tuple(
            _placeholders_known(
                _text(p, f"{field}.parameters[{i}]", MAX_PARAMETER, required=True), f"{field}.parameters[{i}]"
            )
            for i, p in enumerate(raw)
        )
        return Message(template=template, language=language, parameters=params)
    if template is not None:
        raise ValidationError(f"{field}.template", f"{channel} has no message templates; send a text")
    if data.get("parameters"):
        raise ValidationError(f"{field}.parameters", "parameters belong to a WhatsApp template")
    if text is None:
        raise ValidationError(f"{field}.text", "must not be empty")
    return Message(text=_placeholders_known(_text(text, f"{field}.text", MAX_TEXT, required=True), f"{field}.text"))


# --------------------------------------------------------------------------- campaign


@dataclass(frozen=True, slots=True)
class PlanCounts:
    """How many contacts the planner looked at, kept, and left out per reason."""

    considered: int = 0
    recipients: int = 0
    dropped: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"considered": self.considered, "recipients": self.recipients, "dropped": dict(self.dropped)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PlanCounts:
        return cls(int(d.get("considered", 0)), int(d.get("recipients", 0)), dict(d.get("dropped") or {}))


@dataclass(frozen=True, slots=True)
class ConversationCheck:
    """A preview's look at the sending channel: recipients without a conversation on ``channel_name``.

    The run drops each such recipient (``no_conversation_on_channel``, the
    send hook ``campaigns.services.bot_for`` installs). The preview looks up
    only its first ``checked`` recipients (a page, O(page) inbox reads):
    ``without`` and ``examples`` are exact for those; ``exact`` says whether
    they were all the recipients. When not, the others are checked at send time.
    """

    channel_name: str
    checked: int
    without: int
    examples: tuple[str, ...]
    exact: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "channel_name": self.channel_name,
            "checked": self.checked,
            "without_conversation": self.without,
            "examples": list(self.examples),
            "exact": self.exact,
        }


@dataclass(frozen=True, slots=True)
class Campaign:
    """A campaign and where it is in its life. Times are epoch milliseconds.

    ``contact_ids`` (optional) restricts the audience to listed contacts, each
    of which must still match the segment; without it every contact is
    considered. ``rate_per_s`` overrides the channel's default throttle.
    ``plan`` is set when the recipients were fixed (at the start of the run).
    """

    id: str
    name: str
    segment_id: str
    channel: str
    message: Message
    channel_name: str | None = None
    contact_ids: tuple[str, ...] | None = None
    rate_per_s: float | None = None
    state: str = "draft"
    scheduled_at: int | None = None
    plan: PlanCounts | None = None
    error: str | None = None
    created_by: str = ""
    created_at: int = 0
    updated_at: int = 0
    started_at: int | None = None
    finished_at: int | None = None
    version: int = 0

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES

    def to_json(self) -> dict[str, Any]:
        """Return the stored JSON of the campaign (without ``version``: the store owns it)."""
        return {
            "id": self.id,
            "name": self.name,
            "segment_id": self.segment_id,
            "channel": self.channel,
            "channel_name": self.channel_name,
            "message": self.message.to_json(),
            "contact_ids": list(self.contact_ids) if self.contact_ids is not None else None,
            "rate_per_s": self.rate_per_s,
            "state": self.state,
            "scheduled_at": self.scheduled_at,
            "plan": self.plan.to_json() if self.plan else None,
            "error": self.error,
            "created_by": self.created_by,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any], version: int = 0) -> Campaign:
        """Return the campaign stored as ``d`` at ``version``."""
        ids = d.get("contact_ids")
        return cls(
            id=d["id"],
            name=d["name"],
            segment_id=d["segment_id"],
            channel=d["channel"],
            message=Message.from_json(d["message"]),
            channel_name=d.get("channel_name"),
            contact_ids=tuple(ids) if ids is not None else None,
            rate_per_s=d.get("rate_per_s"),
            state=d["state"],
            scheduled_at=d.get("scheduled_at"),
            plan=PlanCounts.from_json(d["plan"]) if d.get("plan") else None,
            error=d.get("error"),
            created_by=d.get("created_by", ""),
            created_at=int(d.get("created_at", 0)),
            updated_at=int(d.get("updated_at", 0)),
            started_at=d.get("started_at"),
            finished_at=d.get("finished_at"),
            version=version,
        )


def validate_name(value: object, field: str = "campaign.name") -> str:
    """Return the trimmed campaign name (1-200 characters)."""
    return _text(value, field, MAX_NAME, required=True).strip()


def validate_channel(value: object, field: str = "campaign.channel") -> str:
    if value not in CHANNELS:
        raise ValidationError(field, f"must be one of {', '.join(CHANNELS)}")
    return str(value)


def validate_channel_name(value: object, field: str = "campaign.channel_name") -> str | None:
    if value is None or value == "":
        return None
    from botmesh_admin.kv.tenant import validate_id

    return validate_id(value, field)


def validate_rate(value: object, field: str = "campaign.rate_per_s") -> float | None:
    """Return messages per second (0.1..1000) or ``None`` (the channel default)."""
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadType(field, "must be a number of messages per second")
    if not MIN_RATE <= float(value) <= MAX_RATE:
        raise ValidationError(field, f"must be between {MIN_RATE:g} and {MAX_RATE:g} messages per second")
    return float(value)


def validate_contact_ids(
    value: object, field: str = "campaign.contact_ids", *, given: bool = False
) -> tuple[str, ...] | None:
    """Return the listed contact ids in the given order (duplicates kept: the planner counts them).

    ``given``: a list a client sends (create, update, preview) must name a contact: an empty one would
    make a campaign that sends nothing (leave the field out to send to the whole segment).
    """
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise BadType(field, "must be a list of contact ids")
    if given and not value:
        raise ValidationError(field, "names no contact: leave it out to send to everyone the segment holds")
    if len(value) > MAX_CONTACT_IDS:
        raise ValidationError(field, f"more than {MAX_CONTACT_IDS} contacts")
    for i, item in enumerate(value):
        if not isinstance(item, str) or not re.fullmatch(r"c_[0-9a-f]{22}", item):
            raise ValidationError(f"{field}[{i}]", "not a contact id")
    return tuple(value)


def validate_scheduled_at(value: object, now: int, field: str = "scheduled_at") -> int | None:
    """Return a future time in epoch ms (or ``None``); a time in the past is refused."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadType(field, "must be epoch milliseconds (an integer)")
    if value <= now:
        raise ValidationError(field, "is in the past; pick a time in the future")
    if value > now + 366 * 24 * 3600 * 1000:
        raise ValidationError(field, "is more than a year ahead")
    return value


def validate_campaign(c: Campaign) -> Campaign:
    """Check a fully built campaign again before it reaches a store (defence in depth)."""
    validate_campaign_id(c.id, "campaign.id")
    validate_name(c.name)
    validate_channel(c.channel)
    validate_channel_name(c.channel_name)
    message_from_input(c.message, c.channel)
    validate_rate(c.rate_per_s)
    validate_contact_ids(c.contact_ids)
    if not isinstance(c.segment_id, str) or not re.fullmatch(r"s_[0-9a-f]{22}", c.segment_id):
        raise ValidationError("campaign.segment_id", "not a segment id")
    if c.state not in CAMPAIGN_STATES:
        raise ValidationError("campaign.state", f"must be one of {', '.join(CAMPAIGN_STATES)}")
    if c.error is not None:
        _text(c.error, "campaign.error", 500)
    return c


class StateConflict(Conflict):
    """The campaign is not in a state that allows the action (HTTP 409)."""

    code = "campaign_state"


# --------------------------------------------------------------------------- recipients and slots


@dataclass(frozen=True, slots=True)
class Recipient:
    """A planned recipient: the contact and the canonical address the message goes to."""

    contact_id: str
    address: str
    chat_key: str
    name: str | None = None


def chat_key_of(channel: str, address: str) -> str:
    """Return the conversation key of ``address``: ``whatsapp:573001112233``, ``telegram:700000001``."""
    if channel == "whatsapp":
        return f"whatsapp:{address.lstrip('+')}"
    return f"{channel}:{address}"


@dataclass(frozen=True, slots=True)
class Delivery:
    """One recipient's send slot and outcome (see the module docstring for ``state``).

    ``token`` names the sender holding the slot until ``lease_until`` (ms);
    ``attempts`` counts requests that got an answer; ``sends`` counts accepted
    sends (``mark_sent``) and is never more than 1. ``reason`` says why a slot
    is dropped, cancelled, in doubt or failed for good; ``not_before`` (ms)
    holds a released slot back until a retry is due.
    """

    recipient: str
    contact_id: str
    chat_key: str
    state: str = "pending"
    token: str | None = None
    lease_until: int | None = None
    attempts: int = 0
    sends: int = 0
    provider_message_id: str | None = None
    provider_recipient: str | None = None
    error_code: int | None = None
    error_title: str | None = None
    retryable: bool | None = None
    reason: str | None = None
    not_before: int | None = None
    updated_at: int = 0
    version: int = 0

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES

    def available(self, now: int) -> bool:
        """Return True if a sender may reserve this slot at ``now``."""
        if self.provider_message_id is not None:
            return False
        if self.state == "pending":
            return self.not_before is None or self.not_before <= now
        return self.state == "reserved" and (self.lease_until or 0) <= now

    def stale_sending(self, now: int) -> bool:
        """Return True if the slot was ``sending`` and its sender's lease ran out (it is in doubt)."""
        return self.state == "sending" and (self.lease_until or 0) <= now

    def to_json(self) -> dict[str, Any]:
        """Return the stored JSON of the slot (without ``version``: the store owns it)."""
        return {name: getattr(self, name) for name in _DELIVERY_FIELDS}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], version: int = 0) -> Delivery:
        """Return the slot stored as ``data`` at ``version``."""
        fields: dict[str, Any] = {name: data[name] for name in _DELIVERY_FIELDS if name in data}
        return cls(**fields, version=version)


_DELIVERY_FIELDS = (
    "recipient",
    "contact_id",
    "chat_key",
    "state",
    "token",
    "lease_until",
    "attempts",
    "sends",
    "provider_message_id",
    "provider_recipient",
    "error_code",
    "error_title",
    "retryable",
    "reason",
    "not_before",
    "updated_at",
)


def new_delivery(recipient: Recipient, at: int) -> Delivery:
    """Return the pending slot of a planned recipient."""
    if not recipient.address or len(recipient.address) > MAX_RECIPIENT:
        raise ValidationError("delivery.recipient", f"must be 1-{MAX_RECIPIENT} characters")
    return Delivery(recipient.address, recipient.contact_id, recipient.chat_key, updated_at=at)


@dataclass(frozen=True, slots=True)
class Failure:
    """A provider's refusal: code, title, whether to retry and after how long (ms)."""

    error_code: int | None
    error_title: str | None
    retryable: bool
    retry_after_ms: int | None = None


# The transitions. Each returns the new slot, or ``None`` if the rule does not
# allow it (the slot is not, or no longer, held by ``token``): stores apply them
# inside one compare-and-set, so the rules are the same for every store.


def reserve(d: Delivery, *, token: str, ttl_ms: int, now: int, sending: bool = False) -> Delivery | None:
    """Take an available slot (pending and due, or an expired reservation) until ``now + ttl_ms``.

    With ``sending`` the slot is taken straight into ``sending`` (reserve and
    ``mark_sending`` in one step: the caller's request leaves right after).
    """
    if not d.available(now):
        return None
    return replace(
        d,
        state="sending" if sending else "reserved",
        token=token,
        lease_until=now + ttl_ms,
        not_before=None,
        updated_at=now,
    )


def mark_sending(d: Delivery, *, token: str, ttl_ms: int, now: int) -> Delivery | None:
    """Record that the request of a held slot is leaving (``reserved`` → ``sending``)."""
    if d.state != "reserved" or d.token != token:
        return None
    return replace(d, state="sending", lease_until=now + ttl_ms, updated_at=now)


def _answered(d: Delivery, token: str) -> bool:
    # A late answer is still the truth: it may settle a slot that was marked in doubt meanwhile.
    return d.token == token and d.state in ("sending", "in_doubt")


def mark_sent(
    d: Delivery, *, token: str, provider_message_id: str, provider_recipient: str | None, now: int
) -> Delivery | None:
    """Record the provider's acceptance: its message id, and one more counted send."""
    if not _answered(d, token):
        return None
    return replace(
        d,
        state="accepted",
        provider_message_id=provider_message_id,
        provider_recipient=provider_recipient,
        attempts=d.attempts + 1,
        sends=d.sends + 1,
        lease_until=None,
        error_code=None,
        error_title=None,
        retryable=None,
        reason=None,
        updated_at=now,
    )


def mark_failed(d: Delivery, *, token: str, failure: Failure, max_attempts: int, now: int) -> Delivery | None:
    """Record a refusal: a retryable one releases the slot (due after the delay) until ``max_attempts``."""
    if not _answered(d, token):
        return None
    attempts = d.attempts + 1
    title = (failure.error_title or "")[:300] or None
    if failure.retryable and attempts < max_attempts:
        delay = failure.retry_after_ms if failure.retry_after_ms is not None else 1000 * 2 ** (attempts - 1)
        return replace(
            d,
            state="pending",
            token=None,
            not_before=now + delay,
            reason="retrying",
            attempts=attempts,
            error_code=failure.error_code,
            error_title=title,
            retryable=True,
            lease_until=None,
            updated_at=now,
        )
    reason = f"code:{failure.error_code}" if failure.error_code is not None else "refused"
    if failure.retryable:
        reason = "gave_up"
    return replace(
        d,
        state="failed",
        reason=reason,
        attempts=attempts,
        error_code=failure.error_code,
        error_title=title,
        retryable=failure.retryable,
        lease_until=None,
        updated_at=now,
    )


def mark_dropped(d: Delivery, *, token: str, reason: str, now: int) -> Delivery | None:
    """Drop a held slot before its request leaves (consent withdrawn, a send hook said no)."""
    if d.state != "reserved" or d.token != token:
        return None
    return replace(d, state="dropped", reason=validate_reason(reason), lease_until=None, updated_at=now)


def drop_available(d: Delivery, *, token: str, reason: str, now: int) -> Delivery | None:
    """Drop an available slot before its request leaves: ``reserve`` under ``token``, then ``mark_dropped``."""
    held = reserve(d, token=token, ttl_ms=0, now=now)
    return mark_dropped(held, token=token, reason=reason, now=now) if held is not None else None


def mark_in_doubt(d: Delivery, *, reason: str, now: int, token: str | None = None) -> Delivery | None:
    """Mark a ``sending`` slot whose answer was not recorded: by its sender (``token``) or once expired."""
    if d.state != "sending":
        return None
    if token is not None and d.token != token:
        return None
    if token is None and (d.lease_until or 0) > now:
        return None
    return replace(d, state="in_doubt", reason=validate_reason(reason), updated_at=now)


def release(d: Delivery, *, token: str, now: int) -> Delivery | None:
    """Give a held slot back untouched (the broadcast raised before answering, or the run paused)."""
    if d.state not in ("reserved", "sending") or d.token != token:
        return None
    return replace(d, state="pending", token=None, lease_until=None, updated_at=now)


def cancel(d: Delivery, *, now: int) -> Delivery | None:
    """Cancel a slot nobody holds (pending, or a reservation that expired)."""
    if d.state == "pending" or (d.state == "reserved" and (d.lease_until or 0) <= now):
        return replace(
            d,
            state="cancelled",
            reason="campaign_cancelled",
            token=None,
            lease_until=None,
            not_before=None,
            updated_at=now,
        )
    return None


def resend(d: Delivery, *, now: int) -> Delivery | None:
    """Put an ``in_doubt`` slot back to ``pending`` (a person decided to resend it)."""
    if d.state != "in_doubt" or d.provider_message_id is not None:
        return None
    return replace(d, state="pending", token=None, lease_until=None, reason="resend", not_before=None, updated_at=now)


@dataclass(frozen=True, slots=True)
class DeliveryCounts:
    """Deliveries per state, and per ``state:reason`` for dropped / failed / cancelled / in doubt."""

    total: int = 0
    states: Mapping[str, int] = field(default_factory=dict)
    reasons: Mapping[str, int] = field(default_factory=dict)

    def get(self, state: str) -> int:
        return int(self.states.get(state, 0))

    @property
    def done(self) -> int:
        """Deliveries with an outcome (final or in doubt)."""
        return sum(self.get(s) for s in OUTCOMES)

    @property
    def open(self) -> int:
        return sum(self.get(s) for s in OPEN_STATES)

    @property
    def percent(self) -> int:
        return 100 if not self.total else min(100, self.done * 100 // self.total)


def count_deliveries(deliveries: Sequence[Delivery] | Any) -> DeliveryCounts:
    """Return the counts of an iterable of deliveries."""
    states: dict[str, int] = {}
    reasons: dict[str, int] = {}
    total = 0
    for d in deliveries:
        total += 1
        states[d.state] = states.get(d.state, 0) + 1
        if d.state in REASON_STATES and d.reason:
            key = f"{d.state}:{d.reason}"
            reasons[key] = reasons.get(key, 0) + 1
    return DeliveryCounts(total, dict(sorted(states.items())), dict(sorted(reasons.items())))
