"""What may leave the process in a span: ids only as keyed hashes, never message content.

Applied twice: when the ``span()`` helper sets attributes, and to every
finished span before any exporter sees it (``GuardedSpanProcessor``), so spans
of third-party instrumentation (Django, Celery) pass the same rules:

- an attribute named like an identity (``chat_id``, ``sender_id``, ``phone``,
  ``wa_id``, ``recipient``…), or naming the client of a request (its IP address,
  host name or user agent, under any semantic-conventions version), is replaced
  by ``<name>_hash`` = ``hash_id(value)``;
- an attribute named like content (``text``, ``body``, ``caption``, ``note``,
  ``message``, ``content``…) is dropped;
- URLs lose their query string and fragment (``url.query`` is dropped);
- a run of 7+ digits in any string (a phone number in a path) becomes ``h:<hash>``,
  except in ``TENANT_NAMES`` (a tenant id is the operator's name for a shop,
  validated as such, and traces are filed and filtered by it: ``shop-5730012``
  must stay ``shop-5730012``);
- exception events keep only ``exception.type`` and ``exception.escaped``; the
  message and the stack trace (whose last line repeats the message) are dropped,
  and the span status keeps only the exception type.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from typing import Any

from django.core.signals import setting_changed
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Event, ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import Link, Status, StatusCode

ID_NAMES = frozenset(
    {
        "chat_id",
        "chatid",
        "sender_id",
        "senderid",
        "phone",
        "phone_number",
        "phonenumber",
        "wa_id",
        "waid",
        "msisdn",
        "recipient",
        "recipient_id",
        "recipientid",
        "from",
        "to",
        "user_id",
        "userid",
        "chat",
        "sender",
        "address",
        "contact_address",
        "email",
        "destination",
    }
)
CONTENT_NAMES = frozenset(
    {
        "text",
        "body",
        "caption",
        "note",
        "notes",
        "message",
        "content",
        "payload",
        "title",
        "reply",
        "message_text",
        "messagetext",
        "description",
        "comment",
        "query",
        "exception.message",
        "exception.stacktrace",
        "url.query",
        "http.request.body",
        "http.response.body",
    }
)
# Who sent a request (OpenTelemetry HTTP semantic conventions, old and new names): personal data
# that must not be readable in a trace, though the same client must still be recognisable.
CLIENT_NAMES = frozenset(
    {
        "http.client_ip",
        "client.address",
        "net.peer.ip",
        "net.peer.name",
        "net.sock.peer.addr",
        "network.peer.address",
        "http.user_agent",
        "user_agent.original",
        "http.request.header.user_agent",
        "http.request.header.x_forwarded_for",
        "http.request.header.x_real_ip",
        "http.request.header.forwarded",
    }
)
URL_NAMES = frozenset({"http.url", "http.target", "url.full", "url.path", "http.route", "url.original"})
TENANT_NAMES = frozenset({"botmesh.tenant"})
MAX_STRING = 256
DIGITS_RE = re.compile(r"(?<![\w.])\+?\d{7,15}(?![\w.])")

_hash_key: bytes | None = None


def _forget_key(*, setting: str, **_: Any) -> None:
    global _hash_key
    if setting == "BOTMESH_HASH_KEY":
        _hash_key = None


setting_changed.connect(_forget_key)


def hash_id(value: object) -> str:
    """Return a keyed hash of an id: HMAC-SHA256 with ``settings.BOTMESH_HASH_KEY``, first 16 hex digits.

    The one hash of chat and sender ids: spans (``guard_attributes``), log
    extras (``logs.IdFilter``) and log messages (``logs.log_id``) all use it,
    so one chat's hash is the same string in a trace and in a log line.

    The same id always gives the same hash (so traces and logs of one chat can
    be matched), and without the key the id cannot be recovered or guessed
    by hashing candidate phone numbers.
    """
    global _hash_key
    key = _hash_key
    if key is None:
        from django.conf import settings

        if not settings.configured:  # a script without Django settings: still never the raw id
            key = b""
        else:
            key = _hash_key = str(settings.BOTMESH_HASH_KEY).encode("utf-8")
    data = str(value).strip().encode("utf-8", "surrogatepass")
    return hmac.new(key, data, hashlib.sha256).hexdigest()[:16]


def _leaf(key: str) -> str:
    return key.rsplit(".", 1)[-1].lower()


def guard_text(text: str) -> str:
    """Return ``text`` with digit runs hashed and cut to 256 characters."""
    text = DIGITS_RE.sub(lambda m: "h:" + hash_id(m.group(0)), text)
    return text if len(text) <= MAX_STRING else text[: MAX_STRING - 1] + "…"


def _strip_url(value: str) -> str:
    return value.split("?", 1)[0].split("#", 1)[0]


def _guard_value(value: Any) -> Any:
    if isinstance(value, str):
        return guard_text(value)
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, Sequence):
        return tuple(_guard_value(v) for v in value)[:32]
    return guard_text(str(value))


@functools.lru_cache(maxsize=2048)
def _rule(key: str) -> str:
    """Return what the guard does with an attribute named ``key``: drop, hash, tenant, url or value.

    Depends on the name only, and every span asks it for every attribute (twice
    for the ``span()`` helper's): remembered per name.
    """
    leaf = _leaf(key)
    if key.lower() in CONTENT_NAMES or leaf in CONTENT_NAMES:
        return "drop"
    if leaf in ID_NAMES or key.lower() in CLIENT_NAMES:
        return "hash"
    if key in TENANT_NAMES:
        return "tenant"
    return "url" if key in URL_NAMES else "value"


def guard_attributes(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    """Return ``attributes`` with identities hashed, content dropped and URLs stripped (see module doc)."""
    out: dict[str, Any] = {}
    for key, value in (attributes or {}).items():
        if value is None:
            continue
        rule = _rule(key)
        if rule == "drop":
            continue
        if rule == "hash":
            out[f"{key}_hash"] = hash_id(value)
        elif rule == "url" and isinstance(value, str):
            out[key] = guard_text(_strip_url(value))
        elif rule == "tenant" and isinstance(value, str):
            out[key] = value[:MAX_STRING]
        else:
            out[key] = _guard_value(value)
    return out


def _guard_event(event: Event) -> Event:
    attributes = dict(event.attributes or {})
    if event.name == "exception":
        kept: dict[str, Any] = {k: attributes[k] for k in ("exception.type", "exception.escaped") if k in attributes}
        return Event("exception", kept, event.timestamp)
    return Event(guard_text(event.name), guard_attributes(attributes), event.timestamp)


def _guard_status(status: Status) -> Status:
    if status.status_code is not StatusCode.ERROR or not status.description:
        return status
    head = status.description.split(":", 1)[0].strip()
    return Status(StatusCode.ERROR, head if head.replace(".", "").replace("_", "").isalnum() else "error")


def guard_span(span: ReadableSpan) -> ReadableSpan:
    """Return a copy of a finished span that follows the rules of this module."""
    links = [Link(link.context, guard_attributes(link.attributes)) for link in span.links]
    return ReadableSpan(
        name=guard_text(span.name),
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=guard_attributes(span.attributes),
        events=[_guard_event(e) for e in span.events],
        links=links,
        kind=span.kind,
        status=_guard_status(span.status),
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


class GuardedSpanProcessor(SpanProcessor):
    """Pass each finished span through ``guard_span`` before the wrapped processor (and its exporter) sees it."""

    def __init__(self, inner: SpanProcessor) -> None:
        self.inner = inner

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.inner.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        self.inner.on_end(guard_span(span))

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)
