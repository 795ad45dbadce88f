"""WhatsApp Cloud API webhooks: signature, verification handshake, and parsing.

Spec: Meta's "Webhooks — Getting started" (``X-Hub-Signature-256`` is
``"sha256=" + hex(HMAC-SHA256(app secret, raw request body))``; the GET handshake
echoes ``hub.challenge`` when ``hub.mode == "subscribe"`` and ``hub.verify_token``
matches) and the WhatsApp Cloud API webhook payload reference (``entry[].changes[]
.value`` with ``metadata``, ``contacts``, ``messages`` and ``statuses``).

Pure functions: no Django, no I/O. The parser is tolerant (a body without
messages yields nothing; a message without ``from``/``id`` is skipped) because a
webhook must never be rejected for a shape Meta adds later; only a body that is
not a JSON object, or a message or status whose ``timestamp`` is not a plausible
Unix time, raises ``ValidationError`` (a time is never guessed).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Mapping
from typing import Any

from botmesh_admin.errors import ValidationError
from botmesh_admin.validation import display_name

from .domain import (
    STATUSES,
    Button,
    InboundEvent,
    InboundMessage,
    Location,
    Media,
    Reaction,
    StatusUpdate,
    message_time_ms,
)

CHANNEL = "whatsapp"
SIGNATURE_HEADER = "X-Hub-Signature-256"
MEDIA_TYPES = ("image", "video", "audio", "document", "sticker")


def signature(raw_body: bytes, app_secret: str) -> str:
    """Return the ``X-Hub-Signature-256`` value Meta sends for ``raw_body``."""
    digest = hmac.new(app_secret.encode("utf-8"), raw_body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def verify_signature(raw_body: bytes, header: str | None, app_secret: str) -> bool:
    """Return True if ``header`` is the HMAC-SHA256 of the raw body under ``app_secret``.

    Compared in constant time (``hmac.compare_digest``); a missing header, another
    scheme or an empty secret is False.
    """
    if not header or not app_secret:
        return False
    expected = signature(raw_body, app_secret).encode("ascii")
    return hmac.compare_digest(expected, header.strip().lower().encode("utf-8", "replace"))


def verify_handshake(params: Mapping[str, str], verify_token_check: Callable[[str], bool]) -> str | None:
    """Return ``hub.challenge`` to echo if the subscription handshake is valid, else None.

    Valid: ``hub.mode`` is ``subscribe``, ``hub.verify_token`` passes
    ``verify_token_check`` and ``hub.challenge`` is present.
    """
    token = params.get("hub.verify_token") or ""
    challenge = params.get("hub.challenge") or ""
    if params.get("hub.mode") != "subscribe" or not token or not challenge:
        return None
    return challenge if verify_token_check(token) else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: Any) -> str | None:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def _ms(seconds: Any, field: str) -> int:
    # The Cloud API sends Unix seconds as a string of digits ("1764489600").
    # At most 20 digits: Python refuses to read an integer of over 4,300 (a ValueError, not a 422).
    if isinstance(seconds, str) and seconds.isascii() and seconds.isdigit() and len(seconds) <= 20:
        seconds = int(seconds)
    elif isinstance(seconds, str) and seconds.isascii() and seconds.isdigit():
        raise ValidationError(field, f"must be Unix seconds, not a number of {len(seconds)} digits")
    elif isinstance(seconds, str):
        raise ValidationError(field, f"must be Unix seconds written as digits, not {seconds[:20]!r}")
    return message_time_ms(seconds, field, unit_ms=1000)


def _changes(body: Any) -> list[tuple[str, dict[str, Any]]]:
    """Return ``(path, value)`` of every change, the path naming it for errors (``entry[0].changes[1].value``)."""
    if not isinstance(body, dict):
        raise ValidationError("body", "not a JSON object")
    values = []
    for i, entry in enumerate(_list(body.get("entry"))):
        for j, change in enumerate(_list(_dict(entry).get("changes"))):
            value = _dict(_dict(change).get("value"))
            if value:
                values.append((f"entry[{i}].changes[{j}].value", value))
    return values


def phone_number_ids(body: Any) -> list[str]:
    """Return the distinct ``metadata.phone_number_id`` values of a webhook body, in order."""
    seen: list[str] = []
    for _, value in _changes(body):
        pid = _str(_dict(value.get("metadata")).get("phone_number_id"))
        if pid and pid not in seen:
            seen.append(pid)
    return seen


def parse_webhook(
    body: Any, channel_names: Mapping[str, str] | None = None, *, skipped: list[str] | None = None
) -> list[InboundEvent]:
    """Return every message and status of every entry and change, in body order.

    ``channel_names`` maps a ``metadata.phone_number_id`` to the name of the
    tenant's channel for that number: each event carries the ``channel_name``
    of the change it came in (one Meta app may post one body whose entries are
    for several numbers), ``None`` for a number not in the map.
    A message without a ``from`` or an ``id``, or a status without an ``id``
    or with a ``status`` other than ``sent``, ``delivered``, ``read`` and
    ``failed`` (the Cloud API's), cannot be stored: it yields no event, and its path
    (``entry[0].changes[0].value.messages[1]``) is appended to ``skipped``
    when given (the webhook answers how many it skipped).
    Raise ``ValidationError`` if ``body`` is not a JSON object or a time is not
    Unix seconds (naming it: ``entry[0].changes[0].value.messages[1].timestamp``).
    """
    events: list[InboundEvent] = []
    for path, value in _changes(body):
        pid = _str(_dict(value.get("metadata")).get("phone_number_id"))
        channel_name = (channel_names or {}).get(pid) if pid else None
        names = {}
        for contact in _list(value.get("contacts")):
            contact = _dict(contact)
            wa_id = _str(contact.get("wa_id"))
            if wa_id:
                # as the admin shows it: no control or bidi characters (validation.display_name)
                names[wa_id] = display_name(_str(_dict(contact.get("profile")).get("name")))
        for k, message in enumerate(_list(value.get("messages"))):
            parsed = _message(_dict(message), names, f"{path}.messages[{k}]", channel_name)
            if parsed is not None:
                events.append(parsed)
            elif skipped is not None:
                skipped.append(f"{path}.messages[{k}]: no from or id")
        for k, status in enumerate(_list(value.get("statuses"))):
            parsed_status = _status(_dict(status), f"{path}.statuses[{k}]", channel_name)
            if parsed_status is not None:
                events.append(parsed_status)
            elif skipped is not None:
                skipped.append(f"{path}.statuses[{k}]: no id, or a status none of {', '.join(STATUSES)}")
    return events


def _message(
    msg: dict[str, Any], names: dict[str, str | None], path: str, channel_name: str | None
) -> InboundMessage | None:
    sender, message_id = _str(msg.get("from")), _str(msg.get("id"))
    if sender is None or message_id is None:
        return None
    raw_type = _str(msg.get("type")) or "unsupported"
    fields: dict[str, Any] = {"type": "unsupported"}
    content = _dict(msg.get(raw_type))
    if raw_type == "text":
        fields = {"type": "text", "text": _str(content.get("body"))}
    elif raw_type in MEDIA_TYPES and _str(content.get("id")):
        caption = _str(content.get("caption"))
        media = Media(
            id=str(content["id"]),
            mime_type=_str(content.get("mime_type")),
            caption=caption,
            filename=_str(content.get("filename")),
            sha256=_str(content.get("sha256")),
        )
        fields = {"type": raw_type, "text": caption, "media": media}
    elif raw_type == "interactive":
        kind = _str(content.get("type")) or ""
        reply = _dict(content.get(kind))
        if kind in ("button_reply", "list_reply") and _str(reply.get("id")):
            button = Button(
                id=str(reply["id"]),
                title=_str(reply.get("title")),
                kind=kind,
                description=_str(reply.get("description")),
            )
            fields = {"type": "button", "text": button.title, "button": button}
    elif raw_type == "button" and _str(content.get("payload")):
        # A quick-reply button of a template message.
        button = Button(id=str(content["payload"]), title=_str(content.get("text")), kind="quick_reply")
        fields = {"type": "button", "text": button.title, "button": button}
    elif raw_type == "reaction" and _str(content.get("message_id")):
        reaction = Reaction(target_message_id=str(content["message_id"]), emoji=content.get("emoji") or "")
        fields = {"type": "reaction", "reaction": reaction}
    elif raw_type == "location" and _is_number(content.get("latitude")) and _is_number(content.get("longitude")):
        location = Location(
            latitude=float(content["latitude"]),
            longitude=float(content["longitude"]),
            name=_str(content.get("name")),
            address=_str(content.get("address")),
        )
        fields = {"type": "location", "text": location.name, "location": location}
    elif raw_type == "contacts":
        shared = [_str(_dict(_dict(c).get("name")).get("formatted_name")) for c in _list(msg.get("contacts"))]
        fields = {"type": "contacts", "text": ", ".join(n for n in shared if n) or None}
    return InboundMessage(
        channel=CHANNEL,
        chat_key=f"{CHANNEL}:{sender}",
        sender_id=f"{CHANNEL}:{sender}",
        provider_message_id=message_id,
        timestamp_ms=_ms(msg.get("timestamp"), f"{path}.timestamp"),
        sender_name=names.get(sender),
        reply_to=_str(_dict(msg.get("context")).get("id")),
        raw_type=raw_type,
        channel_name=channel_name,
        **fields,
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _status(status: dict[str, Any], path: str, channel_name: str | None) -> StatusUpdate | None:
    message_id, state = _str(status.get("id")), _str(status.get("status"))
    if message_id is None or state not in STATUSES:
        return None
    error = _dict(next(iter(_list(status.get("errors"))), None))
    code = error.get("code")
    recipient = _str(status.get("recipient_id"))
    return StatusUpdate(
        channel=CHANNEL,
        provider_message_id=message_id,
        status=state,
        timestamp_ms=_ms(status.get("timestamp"), f"{path}.timestamp"),
        error_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
        error_title=_str(error.get("title")) or _str(error.get("message")),
        recipient=recipient,
        chat_key=f"{CHANNEL}:{recipient}" if recipient else None,
        channel_name=channel_name,
    )
