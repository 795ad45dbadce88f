"""Journal consumers of the inbox (imported from ``InboxConfig.ready()``).

- ``ledger.message`` (channel ``inbound``): one bot ledger record, ``payload = {"record": StoredMessage JSON}``.
- ``whatsapp.webhook`` / ``telegram.update`` (channel ``inbound``): ``payload = {"config": name,
  "events": [InboundMessage / StatusUpdate / MemberUpdate .to_json(), ...]}``.
- ``inbox.reply`` (channel ``outbox``): send an agent's reply (``inbox.services.replies``).

The worker hands the ``inbound`` records of a claimed batch to
``project_inbound_batch`` at once (``register_batch``): one commit per
conversation, the batch's reads prefetched, each record still failing alone,
and the outcome that of projecting the records one by one.

Every handler is idempotent (the journal delivers at least once). A projection
failure is reported — logged with the conversation-free event id, counted in
the ``errors`` metric — and raised to the worker, so the journal record is
retried and, after its last attempt, dead-lettered; it never reaches the
webhook or the bot that sent the message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

from botmesh_admin.events.base import EventRecord
from botmesh_admin.events.handlers import register, register_batch
from botmesh_admin.events.worker import Claim, current_claim

from . import services
from .services import replies

log = logging.getLogger(__name__)


def _file_under(conversation_id: str | None, message_ids: list[str | None] | None = None) -> None:
    """Name the conversation and the messages (hashed) on the current span: the trace is found from both."""
    from opentelemetry import trace

    from botmesh_admin.observability import trace_records
    from botmesh_admin.observability.guard import hash_id

    current = trace.get_current_span()
    if not current.is_recording():
        return
    if conversation_id:
        current.set_attribute("botmesh.conversation_id", conversation_id)
    hashes = [hash_id(m) for m in message_ids or () if m]
    if hashes:  # the thread's "trace" link of a message looks its hash up
        current.set_attribute(trace_records.MESSAGE_HASHES, hashes[: trace_records.MAX_MESSAGES])


@contextmanager
def _reported(record: EventRecord, what: str) -> Iterator[None]:
    from botmesh_admin.observability import tracing

    carrier = record.payload.get("trace") if isinstance(record.payload, dict) else None
    try:
        # The span continues the trace of the request that journaled the record (the payload's
        # ``trace`` carrier): one message, one trace, across processes.
        with tracing.span(
            f"inbox.{what}",
            parent=carrier if isinstance(carrier, dict) else None,
            tenant=record.tenant,
            event_id=record.id,
            event_type=record.type,
        ):
            yield
    except Exception as exc:
        failure = (what, record.id, record.attempts, type(exc).__name__)
        # In a batch, once it is known the record is not projected again (a redo reports its own failure).
        services.after_projection(partial(_report_failure, *failure))
        raise


def _report_failure(what: str, event_id: str, attempts: int, error: str) -> None:
    from botmesh_admin.observability import metrics

    log.error("inbox %s of event %s failed (attempt %d): %s", what, event_id, attempts, error)
    metrics.count("errors")


@register(services.LEDGER_EVENT)
def project_ledger_record(record: EventRecord) -> None:
    """Project one bot ledger record into its tenant's inbox."""
    with _reported(record, "project"):
        result = services.message_project(record.tenant, record.payload["record"])
        _file_under(result.conversation_id, [result.message_id])


def _project_events(record: EventRecord) -> None:
    from botmesh_admin.channels.domain import event_from_json

    with _reported(record, "project"):
        conversation, messages = None, []
        for data in record.payload.get("events", []):
            result = services.event_project(record.tenant, event_from_json(data))
            if result is not None:
                conversation = conversation or result.conversation_id
                messages.append(result.message_id)
        _file_under(conversation, messages)


project_whatsapp_webhook: Callable[[EventRecord], None] = register("whatsapp.webhook")(_project_events)
project_telegram_update: Callable[[EventRecord], None] = register("telegram.update")(_project_events)


_PROJECTIONS: dict[str, Callable[[EventRecord], None]] = {
    services.LEDGER_EVENT: project_ledger_record,
    "whatsapp.webhook": project_whatsapp_webhook,
    "telegram.update": project_telegram_update,
}


@register_batch(services.LEDGER_EVENT)
@register_batch("whatsapp.webhook")
@register_batch("telegram.update")
def project_inbound_batch(records: Sequence[EventRecord]) -> list[Exception | None]:
    """Project a claimed batch of ledger records and webhook events at once (one outcome per record).

    Each record is projected by its own handler above (its span, its
    ``_file_under``, its report on failure), against the batch's buffered store;
    the batch is then written one commit per conversation
    (``services.project_batched``).
    """
    units = [partial(_PROJECTIONS[r.type], r) for r in records]
    return services.project_batched(units, prefetch=partial(_prefetch, records))


def _prefetch(records: Sequence[EventRecord], store: Any) -> None:
    """Read, per tenant in two ``get_many`` each, the conversations, messages and CRM contacts ``records`` need."""
    from botmesh_admin.channels.domain import event_from_json

    wanted: dict[str, tuple[list[tuple[str, str | None]], list[str]]] = {}
    senders: dict[str, list[tuple[str, str, str | None]]] = {}  # tenant -> (channel, sender id, profile name)
    for record in records:
        chats, ids = wanted.setdefault(record.tenant, ([], []))
        payload = record.payload if isinstance(record.payload, dict) else {}
        if record.type == services.LEDGER_EVENT:
            data = payload.get("record")
            if isinstance(data, dict) and isinstance(data.get("chatId"), str):
                chats.append((data["chatId"], data.get("channelName")))
                ids += [v for v in (data.get("id"), data.get("providerMessageId")) if isinstance(v, str)]
            continue
        events = payload.get("events")
        for item in events if isinstance(events, list) else []:
            try:
                event = event_from_json(item)
            except Exception:  # noqa: BLE001 - the record's own projection reports it
                continue
            chat_key = getattr(event, "chat_key", None)
            if chat_key:
                chats.append((chat_key, getattr(event, "channel_name", None)))
            sender_id = getattr(event, "sender_id", None)
            if isinstance(sender_id, str) and sender_id and isinstance(getattr(event, "channel", None), str):
                senders.setdefault(record.tenant, []).append(
                    (event.channel, sender_id, getattr(event, "sender_name", None))
                )
            reaction = getattr(event, "reaction", None)
            ids += [
                v
                for v in (
                    getattr(event, "provider_message_id", None),
                    getattr(event, "edit_of", None),
                    getattr(reaction, "target_message_id", None),
                )
                if isinstance(v, str) and v
            ]
    for tenant, (chats, ids) in wanted.items():
        store.prefetch(tenant, chats=chats, message_ids=ids)
    for tenant, people in senders.items():
        try:
            services.prefetch_contacts(tenant, people)
        except Exception as exc:  # noqa: BLE001 - only an optimisation: each message upserts its contact itself
            log.info("inbox batch: contacts not read ahead: %s", type(exc).__name__)


def _claim_of(record: EventRecord) -> Claim:
    """The worker's claim of ``record``; outside a worker (a direct dispatch) one of the default lease."""
    from botmesh_admin.events import default_journal
    from botmesh_admin.events.services import DEFAULT_LEASE_MS

    claim = current_claim()
    if claim is not None and claim.event_id == record.id and claim.fencing_token == record.fencing_token:
        return claim
    return Claim(default_journal(), record.id, record.fencing_token, DEFAULT_LEASE_MS)


@register(replies.REPLY_EVENT)
def send_reply(record: EventRecord) -> None:
    """Send an agent's reply through its channel's provider (see ``inbox.services.replies``)."""
    with _reported(record, "reply"):
        # The claim's fencing token is checked right before the provider request (issue 15, item 6).
        sent = replies.reply_send(record.tenant, record.payload["message_id"], claim=_claim_of(record))
        _file_under(sent.conversation_id if sent is not None else None, [sent.id if sent is not None else None])
