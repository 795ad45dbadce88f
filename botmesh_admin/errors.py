"""The one domain error hierarchy of botmesh-admin.

Every error a service, selector or store raises on purpose is a ``DomainError``:
it carries a stable ``code`` (for API clients), an HTTP ``status`` and, where it
applies, the ``field`` path at fault. The REST API renders all of them in one JSON
shape ``{"error": code, "message": ..., "field": ...}`` (see ``botmesh_admin.api``).

Modelled on Zulip's ``JsonableError``: the error knows its code and status, so
no view has to translate it.
"""

from __future__ import annotations

from typing import Any

MAX_ECHO_CHARS = 200
"""Characters of a client's own text (a field path, a key) an error message repeats at most."""


def bounded(text: str, limit: int = MAX_ECHO_CHARS) -> str:
    """Return ``text``, or its first ``limit - 1`` characters and ``…`` when it is longer.

    A field path can hold a client's key (``contact.attributes.<key>``): a
    5,000-character key must not come back 5,000 characters long, twice.
    """
    return text if len(text) <= limit else text[: limit - 1] + "…"


class DomainError(Exception):
    """Base of every deliberate error. Subclasses set ``code`` and ``status``."""

    code: str = "error"
    status: int = 400

    def __init__(self, message: str, *, field: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.field = bounded(field) if field is not None else None
        self.details = details

    def to_json(self) -> dict[str, Any]:
        """Return the JSON body the API sends for this error."""
        body: dict[str, Any] = {"error": self.code, "message": self.message, "field": self.field}
        body.update(self.details)
        return body


class ValidationError(DomainError, ValueError):
    """A value failed validation; ``field`` names its path (``contact.channels[1].address``).

    The path is cut to ``MAX_ECHO_CHARS`` (with ``…``) in ``field`` and in the message.

    Subclasses ``ValueError`` (and, through ``BadType``, ``TypeError``) so plain
    Python callers can catch it without importing this module. HTTP 422.
    """

    code = "validation_error"
    status = 422

    def __init__(self, field: str, problem: str) -> None:
        path = bounded(field) if field else None
        super().__init__(f"{path}: {problem}" if path else problem, field=path)
        self.problem = problem


class BadType(ValidationError, TypeError):
    """A value has the wrong type (still a ``ValidationError``; HTTP 422)."""


class BadRequest(DomainError):
    """The request itself cannot be read (a multipart body without a boundary, too many files). HTTP 400."""

    code = "bad_request"
    status = 400


class NotFound(DomainError):
    """The object does not exist in the caller's tenant (also for foreign objects). HTTP 404."""

    code = "not_found"
    status = 404


class Conflict(DomainError):
    """A compare-and-set or uniqueness check failed. HTTP 409.

    ``current_version`` (when known) lets the client reload and retry.
    """

    code = "conflict"
    status = 409

    def __init__(self, message: str, *, current_version: int | None = None, **details: Any) -> None:
        super().__init__(message, current_version=current_version, **details)
        self.current_version = current_version


class PermissionDenied(DomainError):
    """The caller's role does not allow this action inside its own tenant. HTTP 403."""

    code = "permission_denied"
    status = 403


class RateLimited(DomainError):
    """Too many requests; ``retry_after_s`` (seconds) says when to come back. HTTP 429."""

    code = "rate_limited"
    status = 429

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.retry_after_s = retry_after_s


class StoreUnavailable(DomainError):
    """A storage backend could not be reached; wraps the driver's own error. HTTP 503."""

    code = "store_unavailable"
    status = 503


RETRY_AFTER_S = 5
"""Seconds a client is told to wait (``Retry-After``) before retrying a 503 that names no delay."""


def retry_after_s(exc: DomainError) -> float | None:
    """Return the seconds of the ``Retry-After`` header to send with ``exc``, or ``None`` for none.

    The error's own ``retry_after_s`` (a 429) when it has one; ``RETRY_AFTER_S``
    for every 503 (a store outage: Meta and Telegram retry a webhook later).
    """
    retry = exc.details.get("retry_after_s")
    if retry is not None:
        return float(retry)
    return float(RETRY_AFTER_S) if exc.status == 503 else None


# (module, exception class, the store it names): a driver's "the server could not be reached".
_OUTAGES = (
    ("django.db", "OperationalError", "the database"),  # refused, lost, shut down, SQLite locked
    ("django.db", "InterfaceError", "the database"),  # the connection is already closed
    ("psycopg", "OperationalError", "PostgreSQL"),
    ("psycopg", "InterfaceError", "PostgreSQL"),
    ("sqlite3", "OperationalError", "SQLite"),  # locked, disk I/O error, unable to open the file
    ("redis.exceptions", "ConnectionError", "Redis"),
    ("redis.exceptions", "TimeoutError", "Redis"),
    ("kombu.exceptions", "OperationalError", "the Celery broker"),
)


def outage_types() -> dict[type[Exception], str]:
    """Return the driver exception types that mean "the server could not be reached", with the store each names.

    Only drivers this process has imported are looked at (an error of a
    driver that was never imported cannot be in flight), so asking costs no import.
    """
    import sys

    found: dict[type[Exception], str] = {}
    for module_name, class_name, store in _OUTAGES:
        module = sys.modules.get(module_name)
        kind = getattr(module, class_name, None) if module is not None else None
        if isinstance(kind, type) and issubclass(kind, Exception):
            found[kind] = store
    return found


def store_unavailable(exc: BaseException) -> StoreUnavailable | None:
    """Return ``exc`` as a ``StoreUnavailable`` if it says a store could not be reached, else ``None``.

    Our Kv, journal and coordinator backends already raise ``StoreUnavailable``.
    The Django database raises ``django.db.OperationalError`` / ``InterfaceError``
    (PostgreSQL stopped, a connection lost, SQLite locked); code that talks to a
    driver directly may raise psycopg's, sqlite3's, redis-py's or kombu's
    connection errors. Each of those becomes a ``StoreUnavailable`` naming the
    store and the error's type (the driver's text stays in the logs: it names
    hosts). Other database errors (``IntegrityError``, ``ProgrammingError`` …)
    are bugs, not outages: ``None``.
    """
    if isinstance(exc, StoreUnavailable):
        return exc
    for kind, store in outage_types().items():
        if isinstance(exc, kind):
            wrapped = StoreUnavailable(f"{store} is unavailable ({type(exc).__name__}); retry later")
            wrapped.__cause__ = exc
            return wrapped
    return None
