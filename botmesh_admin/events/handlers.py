"""The event handler registry: one handler per event type.

A package registers its handlers in its own ``handlers.py`` (found by
autodiscovery on the first ``dispatch``) or anywhere imported at start-up::

    from botmesh_admin.events.handlers import register

    @register("inbox.message")
    def project_message(record: EventRecord) -> None: ...

Handlers run at least once per record (a retry, or a redelivery after a worker
died), so they must be idempotent; ``record.fencing_token`` names the claim.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable

from .base import TYPE_RE, EventRecord

Handler = Callable[[EventRecord], None]

logger = logging.getLogger("botmesh.events")

_handlers: dict[str, Handler] = {}
_discovered = False
_lock = threading.Lock()


class UnknownEventType(LookupError):
    """No handler is registered for the record's type (the record fails, then dead-letters)."""


def register(event_type: str) -> Callable[[Handler], Handler]:
    """Register the decorated function as the handler of ``event_type``.

    Raise ``ValueError`` for a malformed type or when another function already
    handles it (registering the same function again is a no-op).
    """
    if not isinstance(event_type, str) or not TYPE_RE.match(event_type):
        raise ValueError(f"not an event type: {event_type!r}")

    def decorator(fn: Handler) -> Handler:
        current = _handlers.get(event_type)
        if current is not None and _qualname(current) != _qualname(fn):
            raise ValueError(f"event type {event_type!r} is already handled by {_qualname(current)}")
        _handlers[event_type] = fn
        return fn

    return decorator


def unregister(event_type: str) -> None:
    """Forget the handler of ``event_type`` (tests)."""
    _handlers.pop(event_type, None)


def handler_for(event_type: str) -> Handler | None:
    """Return the handler of ``event_type`` (after autodiscovery), or ``None``."""
    _autodiscover()
    return _handlers.get(event_type)


def registered_types() -> list[str]:
    """Return the event types that have a handler, sorted."""
    _autodiscover()
    return sorted(_handlers)


def dispatch(record: EventRecord) -> None:
    """Call the handler of ``record.type``; raise ``UnknownEventType`` when there is none."""
    handler = handler_for(record.type)
    if handler is None:
        raise UnknownEventType(f"no handler registered for event type {record.type!r}")
    handler(record)


def _autodiscover() -> None:
    """Import every installed app's ``handlers`` module (as Django's ``autodiscover_modules``).

    An app whose module fails to import is logged and skipped, so the other
    apps' events keep flowing (that app's events fail with ``UnknownEventType``
    and dead-letter, where an operator sees them); the import is retried on
    the next dispatch.
    """
    global _discovered
    if _discovered:
        return
    with _lock:
        if _discovered:
            return
        from django.apps import apps
        from django.utils.module_loading import module_has_submodule

        complete = True
        for config in apps.get_app_configs():
            if not module_has_submodule(config.module, "handlers"):
                continue
            try:
                importlib.import_module(f"{config.name}.handlers")
            except Exception:
                complete = False
                logger.exception("cannot import %s.handlers; its event types have no handler", config.name)
        _discovered = complete


def _qualname(fn: Handler) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
