"""Telegram Bot API webhooks: the secret-token check and ``Update`` parsing.

Spec: Telegram Bot API, ``setWebhook`` (``secret_token``, 1-256 characters of
``A-Z a-z 0-9 _ -``, sent back in ``X-Telegram-Bot-Api-Secret-Token``) and the
``Update``, ``Message``, ``CallbackQuery`` and ``ChatMemberUpdated`` objects.

In a group or supergroup every participant gets their own conversation:
``chat_key = "telegram:<chat id>:<user id>"``; a private chat is
``"telegram:<chat id>"``. Message ids are unique per bot and chat only, so
``provider_message_id = "<bot>:<chat id>:<message id>"`` where ``<bot>`` is the
tenant's channel name of the bot that received the update (``parse_update``'s
``channel_name``; the second bot's ``message_id`` 1 from the same user is
another message than the first bot's). Every id an event carries
(``reply_to``, ``edit_of``, a callback's) has the same prefix.

Pure functions: no Django, no I/O; tolerant of fields Telegram adds later, but
a message whose ``date`` is not a plausible Unix time is refused (never stored as 1970).
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

from botmesh_admin.errors import ValidationError
from botmesh_admin.validation import display_name

from .credentials import secret_matches
from .domain import (
    Button,
    InboundEvent,
    InboundMessage,
    Location,
    Media,
    MemberUpdate,
    message_time_ms,
)

CHANNEL = "telegram"
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
SECRET_TOKEN_RE = re.compile(r"^[A-Za-z0-9_-]{1,256}$")
GROUP_TYPES = ("group", "supergroup")
# Message content keys, in the order they are recognised, and the normalised type.
CONTENT_TYPES = {
    "text": "text",
    "photo": "image",
    "video": "video",
    "animation": "video",
    "video_note": "video",
    "voice": "audio",
    "audio": "audio",
    "document": "document",
    "sticker": "sticker",
    "location": "location",
    "contact": "contacts",
}


def verify_secret(header: str | None, expected_hash: str | None) -> bool:
    """Return True if the ``X-Telegram-Bot-Api-Secret-Token`` header matches the stored hash.

    ``expected_hash`` comes from ``credentials.secret_hash``; constant-time compare;
    a missing header or an unset secret is False.
    """
    return secret_matches(header, expected_hash)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def chat_key(chat: dict[str, Any], user: dict[str, Any] | None) -> str | None:
    """Return the conversation key of ``user`` in ``chat`` (one conversation per group participant)."""
    chat_id = _int(chat.get("id"))
    if chat_id is None:
        return None
    user_id = _int(_dict(user).get("id"))
    if chat.get("type") in GROUP_TYPES and user_id is not None:
        return f"{CHANNEL}:{chat_id}:{user_id}"
    return f"{CHANNEL}:{chat_id}"


def _name(user: dict[str, Any]) -> str | None:
    """Return the user's name as the admin shows it (``validation.display_name``), else the username."""
    full = " ".join(p for p in (_str(user.get("first_name")), _str(user.get("last_name"))) if p)
    return display_name(full) or display_name(_str(user.get("username")))


def parse_update(
    update: Any, *, now_ms: int | None = None, channel_name: str | None = None, skipped: list[str] | None = None
) -> list[InboundEvent]:
    """Return the events of one ``Update`` (zero or one; a list to match ``whatsapp.parse_webhook``).

    Handles ``message``, ``edited_message``, ``callback_query`` and
    ``my_chat_member``; other update kinds yield nothing. A callback query carries
    no date, so it is stamped with ``now_ms`` (default: the current time).
    ``channel_name`` is the bot's channel: set on the event and prefixed to its ids.
    One of those four kinds without the ids it needs (an integer ``chat.id``
    and ``message_id``; a callback's ``id`` and ``from.id``; a member update's
    chat and ``new_chat_member.status``) yields nothing, and its kind is
    appended to ``skipped`` when given (the webhook answers how many it skipped).
    Raise ``ValidationError`` if ``update`` is not a JSON object or a date is not
    Unix seconds (naming it: ``message.date``).
    """
    if not isinstance(update, dict):
        raise ValidationError("body", "not a JSON object")
    event: InboundEvent | None = None
    bot = f"{channel_name}:" if channel_name else ""
    if "message" in update:
        event = _message(_dict(update["message"]), edited=False, bot=bot)
    elif "edited_message" in update:
        event = _message(_dict(update["edited_message"]), edited=True, bot=bot)
    elif "callback_query" in update:
        now = now_ms if now_ms is not None else time.time_ns() // 1_000_000
        event = _callback(_dict(update["callback_query"]), now, bot=bot)
    elif "my_chat_member" in update:
        event = _member(_dict(update["my_chat_member"]))
    else:
        return []  # a kind this inbox does not handle: nothing to skip
    if event is None:
        if skipped is not None:
            kind = next(k for k in ("message", "edited_message", "callback_query", "my_chat_member") if k in update)
            skipped.append(f"{kind}: without the ids it needs")
        return []
    return [dataclasses.replace(event, channel_name=channel_name)] if channel_name else [event]


def update_id(update: Any) -> int | None:
    """Return the ``update_id`` of an update, or None."""
    return _int(_dict(update).get("update_id"))


def _message(msg: dict[str, Any], *, edited: bool, bot: str) -> InboundMessage | None:
    chat, user = _dict(msg.get("chat")), _dict(msg.get("from"))
    key, chat_id, message_id = chat_key(chat, user), _int(chat.get("id")), _int(msg.get("message_id"))
    if key is None or message_id is None:
        return None
    raw_type = next((k for k in CONTENT_TYPES if k in msg), "unsupported")
    fields = _content(msg, raw_type)
    own_id = f"{bot}{chat_id}:{message_id}"
    reply = _int(_dict(msg.get("reply_to_message")).get("message_id"))
    time_field = "edit_date" if edited and "edit_date" in msg else "date"
    timestamp_ms = message_time_ms(
        msg.get(time_field), f"{'edited_message' if edited else 'message'}.{time_field}", unit_ms=1000
    )
    timestamp = timestamp_ms // 1000
    return InboundMessage(
        channel=CHANNEL,
        chat_key=key,
        sender_id=f"{CHANNEL}:{user['id']}" if _int(user.get("id")) is not None else key,
        # An edit is its own event (the original keeps its id); ``edit_of`` names the original.
        provider_message_id=f"{own_id}:edit:{timestamp}" if edited else own_id,
        timestamp_ms=timestamp_ms,
        sender_name=_name(user),
        reply_to=f"{bot}{chat_id}:{reply}" if reply is not None else None,
        edit_of=own_id if edited else None,
        **fields,
    )


def _content(msg: dict[str, Any], raw_type: str) -> dict[str, Any]:
    caption = _str(msg.get("caption"))
    if raw_type == "text":
        raw_entities = msg.get("entities")
        entities = raw_entities if isinstance(raw_entities, list) else []
        command = any(_dict(e).get("type") == "bot_command" and _dict(e).get("offset") == 0 for e in entities)
        return {"type": "text", "text": _str(msg.get("text")), "raw_type": "bot_command" if command else "text"}
    if raw_type == "photo":
        sizes = [_dict(s) for s in msg["photo"]] if isinstance(msg["photo"], list) else []
        sizes = [s for s in sizes if _str(s.get("file_id"))]
        if not sizes:
            return {"type": "unsupported", "raw_type": raw_type}
        best = max(
            sizes,
            key=lambda s: (_int(s.get("file_size")) or 0, (_int(s.get("width")) or 0) * (_int(s.get("height")) or 0)),
        )
        media = Media(
            id=best["file_id"],
            caption=caption,
            size_bytes=_int(best.get("file_size")),
            width=_int(best.get("width")),
            height=_int(best.get("height")),
        )
        return {"type": "image", "text": caption, "media": media, "raw_type": raw_type}
    content = _dict(msg.get(raw_type))
    if raw_type == "location" and content:
        lat, lon = content.get("latitude"), content.get("longitude")
        if isinstance(lat, int | float) and isinstance(lon, int | float):
            location = Location(latitude=float(lat), longitude=float(lon))
            return {"type": "location", "location": location, "raw_type": raw_type}
    if raw_type == "contact" and content:
        name = " ".join(p for p in (_str(content.get("first_name")), _str(content.get("last_name"))) if p)
        return {"type": "contacts", "text": name or _str(content.get("phone_number")), "raw_type": raw_type}
    if raw_type in CONTENT_TYPES and _str(content.get("file_id")):
        media = Media(
            id=content["file_id"],
            mime_type=_str(content.get("mime_type")),
            caption=caption,
            filename=_str(content.get("file_name")),
            size_bytes=_int(content.get("file_size")),
            width=_int(content.get("width")),
            height=_int(content.get("height")),
        )
        return {"type": CONTENT_TYPES[raw_type], "text": caption, "media": media, "raw_type": raw_type}
    return {"type": "unsupported", "raw_type": raw_type}


def _button_title(message: dict[str, Any], data: str) -> str | None:
    keyboard = _dict(message.get("reply_markup")).get("inline_keyboard")
    for row in keyboard if isinstance(keyboard, list) else []:
        for button in row if isinstance(row, list) else []:
            if _dict(button).get("callback_data") == data:
                return _str(button.get("text"))
    return None


def _callback(query: dict[str, Any], now_ms: int, *, bot: str) -> InboundMessage | None:
    user, message = _dict(query.get("from")), _dict(query.get("message"))
    query_id, user_id = _str(query.get("id")), _int(user.get("id"))
    if query_id is None or user_id is None:
        return None
    chat = _dict(message.get("chat"))
    key = chat_key(chat, user) or f"{CHANNEL}:{user_id}"  # an inline message has no chat
    data = _str(query.get("data")) or ""
    title = _button_title(message, data)
    message_id, chat_id = _int(message.get("message_id")), _int(chat.get("id"))
    return InboundMessage(
        channel=CHANNEL,
        chat_key=key,
        sender_id=f"{CHANNEL}:{user_id}",
        provider_message_id=f"{bot}callback:{query_id}",
        type="button",
        text=title or data or None,
        timestamp_ms=now_ms,
        sender_name=_name(user),
        button=Button(id=data, title=title, kind="callback"),
        reply_to=f"{bot}{chat_id}:{message_id}" if message_id is not None and chat_id is not None else None,
        raw_type="callback_query",
    )


def _member(update: dict[str, Any]) -> MemberUpdate | None:
    chat, user = _dict(update.get("chat")), _dict(update.get("from"))
    key = chat_key(chat, user)
    status = _str(_dict(update.get("new_chat_member")).get("status"))
    if key is None or status is None:
        return None
    user_id = _int(user.get("id"))
    return MemberUpdate(
        channel=CHANNEL,
        chat_key=key,
        status=status,
        timestamp_ms=message_time_ms(update.get("date"), "my_chat_member.date", unit_ms=1000),
        sender_id=f"{CHANNEL}:{user_id}" if user_id is not None else None,
        previous_status=_str(_dict(update.get("old_chat_member")).get("status")),
    )
