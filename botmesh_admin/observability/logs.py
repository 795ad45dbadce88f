"""Structured logs without customer ids or secrets (ARCHITECTURE §10).

- ``IdFilter`` rewrites the ``chat_id``, ``sender_id`` and ``phone`` extra fields
  (``log.info("sent", extra={"chat_id": …})``) by ``settings.BOTMESH_LOG_IDS``:
  ``hashed`` (default: ``hash_id(value)``, the same hash traces use), ``raw``, or
  ``omit`` (the field is removed). ``log_id(value)`` does the same for an id
  written into the message itself (``log.info("sent to %s", log_id(chat_key))``).
  A chat key that reaches a message's text some other way — a request path
  Django or runserver logs (``Unprocessable Entity: …/handoff/whatsapp:573…``) —
  is rewritten too (``hide_chat_keys``): ``whatsapp:<hash>``.
- ``RedactFilter`` masks secrets in the message, its arguments, the exception
  text and extra fields: API tokens (``bm_…``), bearer/basic credentials,
  Telegram bot tokens, Meta access tokens, signature headers, PEM private keys,
  ``password=``/``secret=``/``token=``-style pairs, URL passwords, and any extra
  field whose name says it is a secret.
- ``JsonFormatter`` writes one JSON object a line (time, level, logger,
  message, extras, trace and span ids of the active span, exception).

``install()`` (called from ``ObservabilityConfig.ready()``) puts both filters on
every handler of the root logger; with ``settings.BOTMESH_LOG_FORMAT = "json"``
it also switches those handlers to ``JsonFormatter``. Settings may also name
these classes directly in ``LOGGING``.
"""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime
from typing import Any

from .guard import hash_id

ID_FIELDS = ("chat_id", "sender_id", "phone")
MASK = "***"

_SECRET_NAME_RE = re.compile(
    r"(pass(word|wd)?|secret|token|api[_-]?key|authorization|credential|private[_-]?key|"
    r"signature|cookie|session[_-]?id|hash[_-]?key|access[_-]?key)",
    re.I,
)
_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S), MASK),
    (re.compile(r"\bbm_[0-9a-f]{6,}_[A-Za-z0-9\-]+"), "bm_" + MASK),
    (re.compile(r"\b(Bearer|Basic|Token)\s+[A-Za-z0-9\-._~+/=]{6,}", re.I), r"\1 " + MASK),
    (re.compile(r"\bbot\d{6,12}:[A-Za-z0-9_-]{30,}"), "bot" + MASK),
    (re.compile(r"\b\d{6,12}:AA[A-Za-z0-9_-]{30,}"), MASK),
    (re.compile(r"\bEAA[A-Za-z0-9]{20,}"), MASK),
    (re.compile(r"\bsha256=[0-9a-f]{64}\b"), "sha256=" + MASK),
    (re.compile(r"(://[^/\s:@]+:)[^@\s/]+@"), r"\1" + MASK + "@"),
    (
        re.compile(
            r"(?i)\b([\w-]*(?:password|passwd|secret|token|api[_-]?key|access[_-]?key|authorization)[\w-]*)"
            r"([\"']?\s*[:=]\s*[\"']?)([^\s\"',;&}]+)"
        ),
        r"\1\2" + MASK,
    ),
]


def redact(text: str) -> str:
    """Return ``text`` with every secret pattern of this module masked."""
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")}


def log_ids_mode() -> str:
    """Return ``settings.BOTMESH_LOG_IDS`` (``hashed``, ``raw`` or ``omit``); ``hashed`` without settings."""
    from django.conf import settings

    if not settings.configured:
        return "hashed"
    return str(getattr(settings, "BOTMESH_LOG_IDS", "hashed"))


def log_id(value: object) -> str:
    """Return a chat or sender id as a log message may show it, by ``BOTMESH_LOG_IDS``.

    ``hashed``: ``hash_id(value)`` (16 hex digits, the hash traces carry);
    ``raw``: the id itself; ``omit``: ``"-"``. For ids inside a message's text;
    ids passed as ``extra`` fields are handled by ``IdFilter`` the same way.
    """
    mode = log_ids_mode()
    if mode == "raw":
        return str(value)
    if mode == "omit":
        return "-"
    return hash_id(value)


# A chat key in text: ``whatsapp:<digits>``, ``telegram:<id>[:<id>]``, also URL-encoded (``%3A``) and
# with a ``+`` (or ``%2B``) before an E.164 number, as request paths and query strings carry them.
_CHAT_KEY_RE = re.compile(r"\b(whatsapp|telegram)(:|%3[Aa])((?:\+|%2[Bb])?-?\d{3,20}(?:(?::|%3[Aa])-?\d{1,20})?)")


def hide_chat_keys(text: str, mode: str | None = None) -> str:
    """Return ``text`` with each chat key in it as ``BOTMESH_LOG_IDS`` says: ``whatsapp:<hash_id>``, kept, or ``-``.

    The hash is ``hash_id`` of the whole key (``whatsapp:573001112233``), the one
    ``log_id`` and the traces give, so a hashed log line still finds its trace.
    """
    mode = mode or log_ids_mode()
    if mode == "raw" or ("whatsapp" not in text and "telegram" not in text):
        return text

    def one(m: re.Match[str]) -> str:
        key = f"{m.group(1)}:{re.sub('%3[Aa]', ':', m.group(3)).replace('%2B', '+').replace('%2b', '+')}"
        return f"{m.group(1)}:-" if mode == "omit" else f"{m.group(1)}:{hash_id(key)}"

    return _CHAT_KEY_RE.sub(one, text)


class IdFilter(logging.Filter):
    """Hash, keep or drop the ``chat_id``/``sender_id``/``phone`` extras (``mode``: hashed, raw, omit)."""

    def __init__(self, mode: str | None = None) -> None:
        super().__init__()
        self._mode = mode

    @property
    def mode(self) -> str:
        return self._mode if self._mode is not None else log_ids_mode()

    def filter(self, record: logging.LogRecord) -> bool:
        mode = self.mode
        if mode == "raw" or getattr(record, "_botmesh_ids_done", False):
            return True
        for name in ID_FIELDS:
            if name in record.__dict__ and record.__dict__[name] is not None:
                if mode == "omit":
                    delattr(record, name)
                else:
                    setattr(record, name, hash_id(record.__dict__[name]))
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: RedactFilter logs it as it can
            message = None
        if message is not None:
            hidden = hide_chat_keys(message, mode)
            if hidden != message:
                record.msg, record.args = hidden, None
        for key, value in _extras(record).items():
            if isinstance(value, str) and key not in ID_FIELDS:
                setattr(record, key, hide_chat_keys(value, mode))
        record._botmesh_ids_done = True
        return True


class RedactFilter(logging.Filter):
    """Mask secrets in the message, the exception text and secret-named extras."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "_botmesh_redacted", False):
            return True
        try:
            message = record.getMessage()
        except Exception:  # a broken format string still gets logged, redacted
            message = f"{record.msg} {record.args}"
        record.msg, record.args = redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        for key, value in _extras(record).items():
            if _SECRET_NAME_RE.search(key) and key not in ID_FIELDS:
                setattr(record, key, MASK)
            elif isinstance(value, str):
                setattr(record, key, redact(value))
        record._botmesh_redacted = True
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ``time`` (ISO UTC), ``level``, ``logger``, ``message``, extras, ``trace_id``…"""

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in _extras(record).items():
            # Anything else as its repr, masked as messages are (Django's ``request`` extra names the path).
            plain = isinstance(value, (str, int, float, bool, type(None)))
            body[key] = value if plain else hide_chat_keys(redact(repr(value)))
        from opentelemetry import trace

        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            body["trace_id"], body["span_id"] = format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            body["exception"] = record.exc_text
        return json.dumps(body, ensure_ascii=False, default=str)


def install(logger: logging.Logger | None = None, *, json_lines: bool | None = None) -> None:
    """Put ``IdFilter`` and ``RedactFilter`` on every handler of ``logger`` (the root), once."""
    logger = logger or logging.getLogger()
    if json_lines is None:
        from django.conf import settings

        json_lines = str(getattr(settings, "BOTMESH_LOG_FORMAT", "plain")).lower() == "json"
    for handler in logger.handlers:
        if not any(isinstance(f, IdFilter) for f in handler.filters):
            handler.addFilter(IdFilter())
        if not any(isinstance(f, RedactFilter) for f in handler.filters):
            handler.addFilter(RedactFilter())
        if json_lines and not isinstance(handler.formatter, JsonFormatter):
            handler.setFormatter(JsonFormatter())
