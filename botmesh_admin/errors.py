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


class DomainError(Exception):
    """Base of every deliberate error. Subclasses set ``code`` and ``status``."""

    code: str = "error"
    status: int = 400

    def __init__(self, message: str, *, field: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.details = details

    def as_dict(self) -> dict[str, Any]:
        """Return the JSON body the API sends for this error."""
        body: dict[str, Any] = {"error": self.code, "message": self.message, "field": self.field}
        body.update(self.details)
        return body


class ValidationError(DomainError, ValueError):
    """A value failed validation; ``field`` names its path (``contact.channels[1].address``).

    Subclasses ``ValueError`` (and, through ``BadType``, ``TypeError``) so plain
    Python callers can catch it without importing this module. HTTP 422.
    """

    code = "validation_error"
    status = 422

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}" if field else problem, field=field or None)
        self.problem = problem


class BadType(ValidationError, TypeError):
    """A value has the wrong type (still a ``ValidationError``; HTTP 422)."""


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
