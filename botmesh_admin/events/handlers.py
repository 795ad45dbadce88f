"""The event handler registry: one handler per event type.

A package registers its handlers in its own ``handlers.py`` (found by
autodiscovery on the first ``dispatch``) or anywhere imported at start-up::

    from botmesh_admin.events.handlers import register

    @register("inbox.message")
    def project_message(record: EventRecord) -> None: ...

Handlers run at least once per record (a retry, or a redelivery after a worker
died), so they must be idempotent; ``record.fencing_token`` names the claim.

A type may also have a *batch handler* (``register_batch``): the worker hands it
every record of a claimed batch it handles at once (one call for all the
batch's records whose types share that function), and it returns one outcome
per record — ``None`` (done: acked) or the exception that record met (failed
alone: retried, then dead-lettered; an outage releases it). It runs outside
any record's claim (``current_claim()`` is ``None``), so it suits work fenced
by compare-and-set, not a provider send. ``dispatch(record)`` of a type with a
batch handler and no single one calls the batch handler with that record.

A type whose records stand for work a person watches (an import, a campaign
run) registers a dead-letter hook too: ``register(type, on_dead_letter=fn)``.
The worker calls ``fn(record)`` once the journal dead-lettered a record of that
type — its last attempt failed, or its last lease expired and the next claim
dead-lettered it — with the record as stored (``state == "dead"``,
``last_error``), so the work it stands for can say "failed" and why instead
of "running" forever. A hook must be idempotent too (a replayed record may
dead-letter again); what it raises is logged, never raised into the worker.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable, Sequence

from .base import TYPE_RE, EventRecord

Handler = Callable[[EventRecord], None]
BatchHandler = Callable[[Sequence[EventRecord]], Sequence[Exception | None]]
"""``fn(records) -> outcomes``: one outcome per record, in order (``None``: done; an exception: that record failed)."""
DeadLetterHook = Callable[[EventRecord], None]

logger = logging.getLogger("botmesh.events")

_handlers: dict[str, Handler] = {}
_batch_handlers: dict[str, BatchHandler] = {}
_dead_letter_hooks: dict[str, DeadLetterHook] = {}
_discovered = False
_lock = threading.Lock()


class UnknownEventType(LookupError):
    """No handler is registered for the record's type (the record fails, then dead-letters)."""


def register(event_type: str, *, on_dead_letter: DeadLetterHook | None = None) -> Callable[[Handler], Handler]:
    """Register the decorated function as the handler of ``event_type`` (and ``on_dead_letter`` as its hook).

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
        if on_dead_letter is not None:
            _dead_letter_hooks[event_type] = on_dead_letter
        return fn

    return decorator


def register_batch(event_type: str) -> Callable[[BatchHandler], BatchHandler]:
    """Register the decorated function as the batch handler of ``event_type`` (see the module docstring).

    One function may handle several types: the worker then gives it the
    records of all of them in one call. Raise ``ValueError`` for a malformed
    type or when another function already batch-handles it.
    """
    if not isinstance(event_type, str) or not TYPE_RE.match(event_type):
        raise ValueError(f"not an event type: {event_type!r}")

    def decorator(fn: BatchHandler) -> BatchHandler:
        current = _batch_handlers.get(event_type)
        if current is not None and _qualname(current) != _qualname(fn):
            raise ValueError(f"event type {event_type!r} is already batch-handled by {_qualname(current)}")
        _batch_handlers[event_type] = fn
        return fn

    return decorator


def unregister(event_type: str) -> None:
    """Forget the handler, the batch handler and the dead-letter hook of ``event_type`` (tests)."""
    _handlers.pop(event_type, None)
    _batch_handlers.pop(event_type, None)
    _dead_letter_hooks.pop(event_type, None)


def batch_handler_for(event_type: str) -> BatchHandler | None:
    """Return the batch handler of ``event_type`` (after autodiscovery), or ``None``."""
    _autodiscover()
    return _batch_handlers.get(event_type)


def handler_for(event_type: str) -> Handler | None:
    """Return the handler of ``event_type`` (after autodiscovery), or ``None``."""
    _autodiscover()
    return _handlers.get(event_type)


def registered_types() -> list[str]:
    """Return the event types that have a handler (or a batch handler), sorted."""
    _autodiscover()
    return sorted({*_handlers, *_batch_handlers})


class Dispatch:
    """The registry as a worker's handler: ``dispatch(record)``, and ``batch_for(type)`` for batches.

    ``EventWorker`` asks ``batch_for`` of each claimed record's type and hands
    the records of one batch handler to it at once; the others go to
    ``dispatch`` one by one.
    """

    def __call__(self, record: EventRecord) -> None:
        """Call the handler of ``record.type``; raise ``UnknownEventType`` when there is none.

        A type with only a batch handler is handled as a batch of one (its
        outcome raised).
        """
        handler = handler_for(record.type)
        if handler is not None:
            handler(record)
            return
        batch = batch_handler_for(record.type)
        if batch is None:
            raise UnknownEventType(f"no handler registered for event type {record.type!r}")
        [outcome] = batch([record])
        if outcome is not None:
            raise outcome

    def batch_for(self, event_type: str) -> BatchHandler | None:
        """Return the batch handler of ``event_type``, or ``None`` (handle its records one by one)."""
        return batch_handler_for(event_type)


dispatch = Dispatch()
"""Call the registered handler of a record (``Dispatch``); the handler every drain uses."""


def dead_lettered(record: EventRecord) -> None:
    """Call the dead-letter hook of ``record.type`` (if it has one) with the dead-lettered ``record``.

    Never raises: the record is in the dead-letter queue already, where an
    operator sees it; a hook that fails is logged with the record's id.
    """
    _autodiscover()
    hook = _dead_letter_hooks.get(record.type)
    if hook is None:
        return
    try:
        hook(record)
    except Exception:  # the worker goes on; the journal page still shows the record dead
        logger.exception("event %s (%s): its dead-letter hook failed", record.id, record.type)


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


def _qualname(fn: Callable[..., object]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
