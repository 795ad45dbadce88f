"""Template filters of the inbox pages: delivery ticks, names (times: the builtin ``when``)."""

from __future__ import annotations

from django import template

from botmesh_admin.timefmt import when

register = template.Library()

TICKS = {"sent": "✓", "delivered": "✓✓", "read": "✓✓", "failed": "!"}
REPLY_LABELS = {
    "queued": "queued",
    "sending": "sending…",
    "accepted": "sent",
    "failed": "not delivered",
    "not_confirmed": "not confirmed",
}


@register.filter
def actor(agent_id: object, tenant: str) -> object:
    """Return how the pages name an agent id (``actor_label``); the filter form, ``{{ id|actor:tenant }}``."""
    return actor_label(agent_id, tenant)


def actor_label(agent_id: object, tenant: str | None) -> object:
    """Return an agent id as the pages show it (``tenancy.selectors.agent_label``); anything else as it is."""
    if not isinstance(agent_id, str) or not tenant:
        return agent_id
    from botmesh_admin.tenancy.selectors import agent_label

    return agent_label(tenant, agent_id)


@register.filter
def ms_time(value: int | None) -> str:
    """Alias of the builtin ``when`` (``botmesh_admin.timefmt``), the one time format of the pages."""
    return when(value)


@register.filter
def ms_iso(value: int | None) -> str:
    """Render epoch ms as an ISO 8601 UTC timestamp (``2026-12-01T14:55:59Z``).

    ``when`` already writes the ``<time datetime>``; this is for other attributes.
    """
    from botmesh_admin.timefmt import instant

    at = instant(value)
    return at.strftime("%Y-%m-%dT%H:%M:%SZ") if at is not None else ""


@register.filter
def ticks(status: str | None) -> str:
    """Return the delivery ticks of a provider status."""
    return TICKS.get(status or "", "")


@register.filter
def reply_label(state: str | None) -> str:
    """Return what an agent reads for a reply state."""
    return REPLY_LABELS.get(state or "", state or "")


@register.filter
def initials(name: str | None) -> str:
    """Return up to two initials of a name (avatar text)."""
    words = [w for w in (name or "").replace(":", " ").split() if w[:1].isalpha()]
    return "".join(w[0].upper() for w in words[:2]) or "#"


@register.filter
def get_item(mapping: dict, key: str) -> object:
    """Return ``mapping[key]`` (or ``""``)."""
    return mapping.get(key, "")


@register.filter
def split(value: str) -> list[str]:
    """Split a string on whitespace."""
    return value.split()


@register.filter
def chat_label(chat_key: str | None) -> str:
    """Return a readable name for an unnamed chat: ``+57 311 212 5184``, ``Telegram 700000101``."""
    channel, _, address = (chat_key or "").partition(":")
    if channel == "whatsapp" and address.isdigit():
        try:
            import phonenumbers

            number = phonenumbers.parse("+" + address)
            return phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.INTERNATIONAL)
        except Exception:  # not a number phonenumbers knows: show it as it is
            return "+" + address
    if channel == "telegram":
        return f"Telegram {address.replace(':', ' · ')}"
    return chat_key or ""


@register.filter
def avatar(conversation: object) -> str:
    """Return the avatar text of a conversation: the name's initials, else the channel's."""
    name = getattr(conversation, "display_name", None)
    if name:
        return initials(name)
    return {"whatsapp": "WA", "telegram": "TG"}.get(getattr(conversation, "channel", ""), "#")


CHANNEL_NAMES = {"whatsapp": "WhatsApp", "telegram": "Telegram"}


@register.filter
def sent_to_console(message: object) -> bool:
    """Return True if ``message`` went out through the console provider (the embedded default).

    Such a reply reached no customer: the console provider only logs it
    (``botmesh_admin.channels.providers.ConsoleProvider``), so the thread
    labels it instead of showing delivery ticks.
    """
    from botmesh_admin.channels.providers import CONSOLE_ID_PREFIX

    return str(getattr(message, "provider_message_id", None) or "").startswith(CONSOLE_ID_PREFIX)


@register.filter
def channel_label(kind: str | None) -> str:
    """Return a channel kind as people write it (``whatsapp`` → ``WhatsApp``)."""
    return CHANNEL_NAMES.get(kind or "", kind or "")


STATUS_EVENTS = {
    "open": "reopened the conversation",
    "pending": "set it pending",
    "resolved": "resolved the conversation",
}


@register.filter
def event_text(event: object, tenant: str | None = None) -> str:
    """Return what an agent reads for a conversation event: ``sofia assigned it to @mateo``.

    The actor is the agent who acted (``you`` never: the thread is shared;
    an API token as ``actor`` names it) or, without one, the system (the
    wake-up job reopening a snoozed conversation).
    """
    kind, value = getattr(event, "kind", ""), getattr(event, "value", None)
    raw = getattr(event, "actor", None)
    actor = actor_label(raw, tenant) if raw and tenant else raw
    if kind == "assigned":
        what = "took the conversation" if value == raw else f"assigned it to @{value}"
    elif kind == "unassigned":
        what = "unassigned it"
    elif kind == "handoff_taken":
        what = "took the chat from the bot"
    elif kind == "handoff_released":
        what = "gave the chat back to the bot"
    elif kind == "status":
        if actor is None and value == "open":
            return "Reopened: the snooze ended"
        what = STATUS_EVENTS.get(str(value), f"set it {value}")
    else:
        what = str(kind)
    return f"{actor or 'The system'} {what}"
