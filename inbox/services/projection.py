"""Projection services: bot ledger records and channel events become conversations and messages.

Every function here is a *write* (a services module, named for what it does)
and is idempotent: the journal delivers at least once, so projecting the same
record or event twice changes nothing the second time.

- ``StoredMessage`` (bot ledger): idempotent by message id; a message the
  webhook already brought (same provider message id) is recorded as an alias.
- ``InboundMessage`` (webhook): a new message; a reaction attaches to the
  message it reacts to; an edit replaces the text and keeps the previous one.
- ``StatusUpdate``: delivery status moves forward only (sent < delivered <
  read); ``failed`` is final and keeps its code and title.
- ``MemberUpdate``: ``kicked``/``left`` marks the conversation blocked and sets
  the contact's consent on that channel to ``denied`` with the evidence (a
  contact erased meanwhile is skipped with a log line, never re-created).

A status or reaction for a message the inbox has not seen yet creates a
*placeholder* outbound message, which the full record replaces when it arrives;
so does an edit projected before its original (an inbound placeholder showing
the edited text, whose previous text is filled in when the original arrives).
Conflicting writers are handled by read → compare-and-set → retry.

A claimed journal batch is projected at once (``project_batched``): every
record's projection runs as above against one buffered store (reads see the
batch's earlier writes), then each conversation's writes are committed as one
merged commit, and the CRM contact upserts of the batch are made once per sender.

Logs carry conversation ids and hashed chat ids only, never raw chat or sender ids.
"""

from __future__ import annotations

import bisect
import contextvars
import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from botmesh_admin.clock import now_ms
from botmesh_admin.errors import DomainError, NotFound, ValidationError

from ..domain import (
    DELIVERY_RANK,
    MAX_EDITS,
    MAX_TEXT,
    Conversation,
    Edit,
    Message,
    MessageReaction,
    StoredMessage,
    new_conversation_id,
    preview,
    received_text,
    replace,
    storable_id,
    validate_conversation,
    validate_message,
    validate_storable_id,
)
from ..stores import default_store
from ..stores.base import Change, InboxStore, chat_retry

if TYPE_CHECKING:
    from botmesh_admin.channels.domain import InboundMessage, MemberUpdate, StatusUpdate


log = logging.getLogger(__name__)

UNPLACED = "cv_" + "0" * 20  # the conversation id a message gets once it is placed


@dataclass(frozen=True)
class Projected:
    """What a projection did: ``outcome`` is ``created``, ``updated``, ``duplicate`` or ``ignored``."""

    outcome: str
    conversation_id: str | None = None
    message_id: str | None = None


def _hash(value: str | None) -> str:
    from botmesh_admin.observability.tracing import hash_id

    return hash_id(value) if value else "-"


def _count(name: str) -> None:
    from botmesh_admin.observability.metrics import count

    after_projection(partial(count, name))


def after_projection(effect: Callable[[], object]) -> None:
    """Run ``effect`` (a metric counted, a failure logged) once the projection that calls it stands.

    Alone, at once. Inside ``project_batched``, once the unit's writes are
    committed — dropped if the unit is redone (the redo runs its own) — so a
    record's effects happen once, as when it is projected alone.
    """
    batch = _batch.get()
    if batch is not None:
        batch.effects.append((effect, batch.unit))
        return
    effect()


@dataclass
class _Batch:
    """The batch being projected (``project_batched``): its buffered store, deferred counts, contacts upserted."""

    store: InboxStore
    unit: int = 0  # the index of the unit running
    effects: list[tuple[Callable[[], object], int]] = field(default_factory=list)  # (effect, index of its unit)
    contacts: dict[tuple[str, str, str], tuple[str | None, str]] = field(default_factory=dict)


_batch: contextvars.ContextVar[_Batch | None] = contextvars.ContextVar("inbox_projection_batch", default=None)


def _store() -> InboxStore:
    """Return the store projection writes to: the batch's buffered store inside ``project_batched``."""
    batch = _batch.get()
    return default_store() if batch is None else batch.store


# -- conversation bookkeeping ---------------------------------------------------------


def _new_conversation(chat_key: str, channel: str, at_ms: int, channel_name: str | None) -> Conversation:
    return Conversation(
        id=new_conversation_id(),
        chat_key=chat_key,
        channel=channel,
        created_at_ms=at_ms,
        updated_at_ms=at_ms,
        channel_name=channel_name,
        keyed_by_chat_only=channel_name is None,
    )


def _conversation_of(
    tenant: str, chat_key: str, channel: str, channel_name: str | None
) -> tuple[Conversation | None, Conversation]:
    """Return ``(stored, conversation)`` of the chat on ``channel_name`` (a new one if none is stored).

    A conversation stored before conversations belonged to a channel is
    assigned the channel that now hears from it.
    """
    stored = _store().conversation_by_chat(tenant, chat_key, channel_name=channel_name)
    if stored is None:
        return None, _new_conversation(chat_key, channel, now_ms(), channel_name)
    if stored.channel_name is None and channel_name is not None:
        return stored, replace(stored, channel_name=channel_name)
    return stored, stored


PENDING_PREVIEW = "[not in the ledger yet]"
"""The list row's preview of a bot message known only from its delivery status (the thread says the same)."""


def _preview_of(m: Message) -> str:
    """Return the list row's preview of ``m``: its text, else what it is (``[image]``, ``PENDING_PREVIEW``)."""
    if m.text:
        return preview(m.text) or ""
    if m.placeholder and m.direction == "out":
        return PENDING_PREVIEW
    return f"[{m.type}]"


def _after_message(conv: Conversation, m: Message, now: int, removed: Message | None = None) -> Conversation:
    """Return the conversation with ``m`` counted (``removed``: the placeholder it replaces)."""
    newest = (m.timestamp_ms, m.id) >= (conv.last_activity_ms, conv.last_message_id or "")
    if removed is not None and removed.id == conv.last_message_id:
        newest = True
    changes: dict[str, Any] = {
        "message_count": conv.message_count + (0 if removed is not None else 1),
        "updated_at_ms": now,
    }
    if newest:
        changes.update(
            last_activity_ms=max(m.timestamp_ms, 0),
            last_message_id=m.id,
            last_text=_preview_of(m),
            last_direction=m.direction,
            last_author=m.reply.author if m.reply is not None else None,
        )
    if m.direction == "in":
        # An inbound placeholder (a message known from its edit) was counted when it was stored.
        counted = removed is not None and removed.direction == "in"
        changes["inbound_count"] = conv.inbound_count + (0 if counted else 1)
        changes["last_inbound_ms"] = max(conv.last_inbound_ms or 0, m.timestamp_ms)
        if m.sender_name and not conv.display_name:
            changes["display_name"] = m.sender_name[:200]
        # A customer writing again reopens a resolved or snoozed conversation.
        if newest and (conv.status == "resolved" or conv.snoozed_until_ms is not None):
            changes.update(status="open", snoozed_until_ms=None, version=conv.version + 1)
    return replace(conv, **changes)


def _merge_placeholder(m: Message, placeholder: Message) -> Message:
    """Return ``m`` carrying what was learnt about it while only its provider id was known."""
    ahead = DELIVERY_RANK.get(placeholder.status or "", 0) > DELIVERY_RANK.get(m.status or "", 0)
    source = placeholder if ahead else m
    if placeholder.edits:
        # Known from its edits first: the first edit's previous text is this record's, the
        # newest text the last edit's (``_edit_placeholder``).
        first, *rest = placeholder.edits
        m = replace(
            m,
            text=placeholder.text,
            media=placeholder.media or m.media,
            edits=(Edit(m.text, first.replaced_at_ms), *rest),
        )
    return replace(
        m,
        status=source.status,
        status_at_ms=source.status_at_ms,
        error_code=source.error_code,
        error_title=source.error_title,
        reactions=placeholder.reactions
        + tuple(r for r in m.reactions if r.sender_id not in {p.sender_id for p in placeholder.reactions}),
        aliases=tuple(dict.fromkeys((*m.aliases, *placeholder.aliases))),
    )


# -- the projection loop ----------------------------------------------------------------


def ingest(
    tenant: str,
    message: Message,
    *,
    chat_key: str,
    channel: str,
    channel_name: str | None = None,
    contact: Callable[[Conversation], str | None] | None = None,
) -> Projected:
    """Add ``message`` (its ``conversation_id`` is filled in) to the conversation of ``chat_key``
    on the channel configuration ``channel_name`` (``None``: the chat's conversation without a channel).

    Idempotent by message id; a message whose provider id belongs to a message
    already stored is recorded as an alias of it (``duplicate``); one that
    replaces a placeholder takes over its status and reactions. ``contact``
    (called outside the write) returns the CRM contact id for the conversation.
    """
    store = _store()
    pid = message.provider_message_id

    def attempt() -> Projected:
        # A webhook message's id is its provider id: one read answers both questions.
        twin = store.message_by_provider_id(tenant, pid) if pid else None
        if twin is None or twin.id != message.id:
            existing = store.message_get(tenant, message.id)
            if existing is not None and (not existing.placeholder or message.placeholder):
                return Projected("duplicate", existing.conversation_id, existing.id)
            twin = existing or twin
        if twin is not None and (twin.id == message.id or message.id in twin.aliases):
            if not twin.placeholder or message.placeholder:
                return Projected("duplicate", twin.conversation_id, twin.id)
        stored, conv = _conversation_of(tenant, chat_key, channel, channel_name)
        m = replace(message, conversation_id=conv.id)
        removed: Message | None = None
        if twin is not None and not twin.placeholder:
            # The same message, known under another id (ledger and webhook): remember this id too.
            store.write(
                tenant,
                Change(
                    messages=(replace(twin, aliases=(*twin.aliases, m.id)),),
                    aliases=((m.id, twin),),
                ),
            )
            return Projected("duplicate", twin.conversation_id, twin.id)
        if twin is not None and twin.conversation_id == conv.id and not m.placeholder:
            removed, m = twin, _merge_placeholder(m, twin)
        elif twin is not None and twin.conversation_id != conv.id and (twin.id == m.id or not m.placeholder):
            # A placeholder (an edit, reaction or status seen first) holds this id, or this provider id, in
            # another chat: the provider never moves a message between chats (WhatsApp ids are unique per
            # message), so the record is refused — not retried against a claim it can never take, nor
            # stored as a second copy that takes the provider id's pointer from the placeholder.
            raise ValidationError(
                "provider_message_id",
                f"message {_hash(message.id)} is already held by a placeholder in another conversation",
            )
        if contact is not None and m.direction == "in":
            contact_id = contact(conv)
            if contact_id and contact_id != conv.contact_id:
                conv = replace(conv, contact_id=contact_id)
        new_conv = validate_conversation(_after_message(conv, validate_message(m), now_ms(), removed))
        store.write(
            tenant,
            Change(
                conversation=new_conv,
                messages=(m,),
                removed=(removed,) if removed else (),
                previous=stored,
            ),
        )
        if conv.revision == 0:
            _count("conversations.started")
        return Projected("created", conv.id, m.id)

    # Exhausted, the journal retries the record later.
    return chat_retry(attempt, busy=f"conversation {_hash(chat_key)} is too busy; the record will be retried")


def update_message(
    tenant: str,
    find: Callable[[], Message | None],
    change: Callable[[Message], Message | None],
    *,
    alias: str | None = None,
) -> Projected | None:
    """Apply ``change`` to the message ``find`` returns, by compare-and-set; ``None`` if not found.

    ``change`` returns the new message or ``None`` for "nothing to do". ``alias``
    (an event's own id) is claimed for the message in the same write, so a
    redelivered event is recognised as a duplicate.
    """
    store = _store()

    def attempt() -> Projected | None:
        if alias is not None:
            seen = store.message_get(tenant, alias)
            if seen is not None:
                return Projected("duplicate", seen.conversation_id, seen.id)
        current = find()
        if current is None:
            return None
        new = change(current)
        if new is None and alias is None:
            return Projected("duplicate", current.conversation_id, current.id)
        new = new or current
        aliases: tuple[tuple[str, Message], ...] = ()
        if alias is not None:
            new = replace(new, aliases=tuple(dict.fromkeys((*new.aliases, alias))))
            aliases = ((alias, new),)
        store.write(tenant, Change(messages=(validate_message(new),), aliases=aliases))
        return Projected("updated", current.conversation_id, current.id)

    return chat_retry(attempt, busy="message is too busy; the record will be retried")


# -- ledger records -------------------------------------------------------------------


def project_stored(tenant: str, record: StoredMessage) -> Projected:
    """Project one bot ledger record into ``tenant`` (the caller checked the record's tenant)."""
    message = Message(
        id=record.id,
        conversation_id=UNPLACED,
        direction=record.direction,
        type=record.type,
        timestamp_ms=record.timestamp_ms,
        text=record.body,
        sender_id=record.sender_id,
        sender_name=record.sender_name,
        provider_message_id=record.provider_message_id,
        source="ledger",
        dropped=record.dropped,
        status="sent" if record.direction == "out" and record.provider_message_id and not record.dropped else None,
        status_at_ms=record.timestamp_ms if record.direction == "out" and record.provider_message_id else None,
    )
    result = ingest(
        tenant,
        message,
        chat_key=record.chat_id,
        channel=record.channel,
        channel_name=record.channel_name,
        contact=lambda conv: _contact_for(tenant, conv, record.channel, record.sender_id, record.sender_name),
    )
    if result.outcome == "created":
        if record.direction == "in":
            _count("messages.in")
        elif record.dropped == "handoff":
            _count("dropped.handoff")
        elif record.dropped is None:
            _count("messages.out")
    log.debug("inbox ledger %s conversation=%s outcome=%s", record.id, result.conversation_id, result.outcome)
    return result


# -- channel events -------------------------------------------------------------------


def _media(event: InboundMessage) -> dict[str, Any] | None:
    if event.media is None:
        return None
    m = event.media
    return {
        k: v
        for k, v in (
            ("id", m.id),
            ("mime_type", m.mime_type),
            ("caption", m.caption),
            ("filename", m.filename),
            ("size_bytes", m.size_bytes),
            ("width", m.width),
            ("height", m.height),
        )
        if v is not None
    }


def _placeholder(provider_id: str, at_ms: int, **fields: Any) -> Message:
    return Message(
        id=validate_storable_id(provider_id, "event.provider_message_id"),
        conversation_id=UNPLACED,
        direction="out",
        type="text",
        timestamp_ms=at_ms,
        provider_message_id=provider_id,
        source="webhook",
        placeholder=True,
        **fields,
    )


def project_inbound(tenant: str, event: InboundMessage) -> Projected:
    """Project a webhook ``InboundMessage`` (a message, a reaction, a button reply or an edit).

    What the customer wrote is kept even when it cannot be stored as it is
    (``received_text``: too long, NUL characters): the provider was already answered 200.
    """
    event = dataclasses.replace(
        event, text=received_text(event.text, MAX_TEXT), sender_name=received_text(event.sender_name, 200)
    )
    if event.reaction is not None:
        return _project_reaction(tenant, event)
    if event.edit_of is not None:
        return _project_edit(tenant, event)
    message = _webhook_message(
        event,
        event.provider_message_id,
        "event.provider_message_id",
        button=None
        if event.button is None
        else {
            "id": event.button.id,
            "title": event.button.title,
            "kind": event.button.kind,
        },
        location=None
        if event.location is None
        else {
            "latitude": event.location.latitude,
            "longitude": event.location.longitude,
            "name": event.location.name,
            "address": event.location.address,
        },
    )
    result = ingest(
        tenant,
        message,
        chat_key=event.chat_key,
        channel=event.channel,
        channel_name=event.channel_name,
        contact=lambda conv: _contact_for(tenant, conv, event.channel, event.sender_id, event.sender_name),
    )
    if result.outcome == "created":
        _count("messages.in")
    return result


def _project_reaction(tenant: str, event: InboundMessage) -> Projected:
    assert event.reaction is not None
    target_id, emoji = event.reaction.target_message_id, event.reaction.emoji
    reaction = MessageReaction(sender_id=event.sender_id, emoji=emoji, at_ms=event.timestamp_ms)

    def react(m: Message) -> Message | None:
        mine = [r for r in m.reactions if r.sender_id == event.sender_id]
        if mine and mine[0].at_ms > event.timestamp_ms:
            return None  # an older reaction arriving late does not undo a newer one
        others = tuple(r for r in m.reactions if r.sender_id != event.sender_id)
        return replace(m, reactions=others + ((reaction,) if emoji else ()))

    done = update_message(
        tenant,
        lambda: _store().message_by_provider_id(tenant, target_id),
        react,
        alias=event.provider_message_id,
    )
    if done is not None:
        return done
    placeholder = _placeholder(
        target_id,
        event.timestamp_ms,
        reactions=(reaction,) if emoji else (),
        aliases=(event.provider_message_id,),
    )
    result = ingest(
        tenant, placeholder, chat_key=event.chat_key, channel=event.channel, channel_name=event.channel_name
    )
    if result.outcome == "duplicate":  # the target arrived meanwhile: attach to it
        return project_inbound(tenant, event)
    return result


def _with_edit(m: Message, text: str | None, at_ms: int, media: dict[str, Any] | None) -> Message | None:
    """Return ``m`` with ``text`` (written at ``at_ms``) in its history; ``None`` if that changes nothing.

    Edits may arrive in any order: the text shown is the one written last (by
    edit time) and each earlier one stays in ``edits``, oldest first. The first
    version (the original, unknown on a placeholder) always stays first.
    """
    texts = [e.text for e in m.edits] + [m.text]
    since = [m.timestamp_ms] + [e.replaced_at_ms for e in m.edits]
    at = 1 + bisect.bisect_right(since[1:], at_ms)
    if texts[at - 1] == text:
        return None  # the same text again (a redelivery, or an edit of the entities only)
    texts.insert(at, text)
    since.insert(at, at_ms)
    edits = tuple(Edit(texts[k], since[k + 1]) for k in range(len(texts) - 1))[-MAX_EDITS:]
    newest = at == len(texts) - 1
    return replace(m, text=texts[-1], edits=edits, media=(media or m.media) if newest else m.media)


def _edit_placeholder(event: InboundMessage) -> Message:
    """Return the message an edit names, known only from the edit (its original not projected yet).

    It shows the edited text; its one edit's previous text is unknown until the
    original arrives and replaces it (``_merge_placeholder`` fills it in).
    """
    assert event.edit_of is not None
    return _webhook_message(
        event,
        event.edit_of,
        "event.edit_of",
        placeholder=True,
        edits=(Edit(None, event.timestamp_ms),),
        aliases=(event.provider_message_id,),
    )


def _webhook_message(event: InboundMessage, message_id: str, field: str, **fields: Any) -> Message:
    """Return the inbound message ``event`` brings, as ``message_id`` (checked, naming ``field``), with ``fields``.

    The one builder of a webhook's message: the message itself (``project_inbound``)
    and the placeholder an early edit stands for (``_edit_placeholder``).
    """
    return Message(
        id=validate_storable_id(message_id, field),
        conversation_id=UNPLACED,
        direction="in",
        type=event.type,
        timestamp_ms=event.timestamp_ms,
        text=event.text,
        sender_id=event.sender_id,
        sender_name=event.sender_name,
        provider_message_id=message_id,
        source="webhook",
        media=_media(event),
        reply_to=storable_id(event.reply_to),  # a quote the inbox cannot store: the message without it
        **fields,
    )


def _project_edit(tenant: str, event: InboundMessage) -> Projected:
    """Apply an edit to the message it names, whatever the order the two arrive in.

    Found: the edit joins its history (``_with_edit``). Not found: the edit is
    stored as a placeholder of its message (``_edit_placeholder``), which the
    original replaces keeping the edited text. If the original (or another edit)
    was stored meanwhile, the placeholder is refused as a duplicate and the edit
    is applied to what was stored: an edit is never dropped for arriving early.
    """
    assert event.edit_of is not None
    target, media = event.edit_of, _media(event)

    def attempt() -> Projected:
        done = update_message(
            tenant,
            lambda: _store().message_by_provider_id(tenant, target),
            lambda m: _with_edit(m, event.text, event.timestamp_ms, media),
            alias=event.provider_message_id,
        )
        if done is not None:
            return done
        result = ingest(
            tenant,
            _edit_placeholder(event),
            chat_key=event.chat_key,
            channel=event.channel,
            channel_name=event.channel_name,
            contact=lambda conv: _contact_for(tenant, conv, event.channel, event.sender_id, event.sender_name),
        )
        if result.outcome == "duplicate":
            raise _EditRaced  # the original (or another edit) was stored meanwhile: apply the edit to it
        return result  # ``messages.in`` counts the original when it replaces the placeholder

    return chat_retry(
        attempt, busy=f"message {_hash(target)} is too busy; the record will be retried", retry_on=_EditRaced
    )


class _EditRaced(Exception):
    """An edit's placeholder lost to its message stored meanwhile (``_project_edit`` applies it again)."""


def project_status(tenant: str, event: StatusUpdate) -> Projected:
    """Apply a delivery status to the outbound message with that provider id (forward only)."""
    rank = DELIVERY_RANK.get(event.status)
    if rank is None:
        return Projected("ignored")

    def advance(m: Message) -> Message | None:
        current = DELIVERY_RANK.get(m.status or "", 0)
        if m.status == "failed" or rank <= current:
            return None  # statuses only move forward; failed is final
        changes: dict[str, Any] = {"status": event.status, "status_at_ms": event.timestamp_ms}
        if event.status == "failed":
            changes.update(error_code=event.error_code, error_title=event.error_title)
        return replace(m, **changes)

    pid = event.provider_message_id
    done = update_message(tenant, lambda: _store().message_by_provider_id(tenant, pid), advance)
    if done is not None:
        if done.outcome == "updated" and event.status == "failed":
            _count("messages.out_failed")
        return done
    if not event.chat_key:
        log.info("inbox status for unknown message %s and no chat; ignored", _hash(pid))
        return Projected("ignored")
    placeholder = _placeholder(
        pid,
        event.timestamp_ms,
        status=event.status,
        status_at_ms=event.timestamp_ms,
        error_code=event.error_code if event.status == "failed" else None,
        error_title=event.error_title if event.status == "failed" else None,
    )
    result = ingest(
        tenant, placeholder, chat_key=event.chat_key, channel=event.channel, channel_name=event.channel_name
    )
    if result.outcome == "duplicate":
        return project_status(tenant, event)
    return result


def project_member(tenant: str, event: MemberUpdate) -> Projected:
    """Record that the user blocked (``kicked``/``left``) or unblocked (``member``) the bot."""
    evidence = (
        f"{event.channel} my_chat_member: {event.previous_status or '?'} -> {event.status} at {event.timestamp_ms} ms"
    )
    contact_id: str | None = None
    store = _store()

    def attempt() -> Conversation | Projected:
        nonlocal contact_id
        stored, conv = _conversation_of(tenant, event.chat_key, event.channel, event.channel_name)
        if stored is None:
            conv = replace(conv, last_activity_ms=event.timestamp_ms)
        if contact_id is None and event.sender_id and conv.contact_id is None:
            # Only a conversation without a contact gets one: a linked contact that was erased
            # must not be re-created from the identity by a block (right to erasure).
            contact_id = _contact_for(tenant, conv, event.channel, event.sender_id, None)
        if event.blocked:
            if conv.blocked and conv.blocked_at_ms is not None and conv.blocked_at_ms >= event.timestamp_ms:
                if conv.contact_id:  # a retry after a consent failure finishes the job
                    _consent_denied(tenant, conv.contact_id, event.channel, conv.blocked_evidence or evidence)
                return Projected("duplicate", conv.id)
            new = replace(conv, blocked=True, blocked_at_ms=event.timestamp_ms, blocked_evidence=evidence)
        elif event.status == "member" and conv.blocked and (conv.blocked_at_ms or 0) < event.timestamp_ms:
            new = replace(conv, blocked=False, blocked_at_ms=event.timestamp_ms, blocked_evidence=evidence)
        else:
            return Projected("ignored", conv.id if conv.revision else None)
        new = replace(new, version=conv.version + 1, updated_at_ms=now_ms(), contact_id=conv.contact_id or contact_id)
        store.write(tenant, Change(conversation=validate_conversation(new), previous=stored))
        return new

    done = chat_retry(attempt, busy="conversation is too busy; the record will be retried")
    if isinstance(done, Projected):
        return done
    new = done
    if event.blocked and new.contact_id:
        _consent_denied(tenant, new.contact_id, event.channel, evidence)
    if event.blocked:
        _count("dropped.blocked")
    return Projected("updated", new.id)


# -- CRM ------------------------------------------------------------------------------


def _address(channel: str, sender_id: str) -> str | None:
    """Return the CRM address of a sender id (``whatsapp:5730…`` → ``+5730…``; ``telegram:7…`` → ``7…``)."""
    prefix, _, rest = sender_id.partition(":")
    if prefix != channel or not rest:
        return None
    if channel == "whatsapp":
        return "+" + rest if rest.isdigit() else None
    if channel == "telegram":
        return rest if rest.isdigit() else None
    return None


def _contact_for(tenant: str, conv: Conversation, channel: str, sender_id: str, name: str | None) -> str | None:
    """Upsert the sender's CRM contact; return its id (``None`` if CRM is unavailable or not applicable).

    A CRM failure is reported (log + ``errors`` metric) and never stops the
    message from being projected; the next inbound message tries again.
    """
    address = _address(channel, sender_id)
    if address is None:
        return conv.contact_id
    batch = _batch.get()
    known = None if batch is None else batch.contacts.get((tenant, channel, address))
    if known is not None and known[0] == name:
        return known[1]  # upserted with the same name earlier in this batch: nothing would change
    try:
        from crm.services import contact_upsert_identity

        contact = contact_upsert_identity(tenant, channel=channel, address=address, name=name, source="inbox")
        if batch is not None:
            batch.contacts[(tenant, channel, address)] = (name, contact.id)
        return contact.id
    except (DomainError, ImportError) as exc:
        log.warning("inbox contact upsert failed conversation=%s: %s", conv.id, type(exc).__name__)
        _count("errors")
        return conv.contact_id


def prefetch_contacts(tenant: str, senders: Sequence[tuple[str, str, str | None]]) -> None:
    """Read the CRM contacts of a batch's senders at once (inside ``project_batched``; elsewhere nothing).

    ``senders``: ``(channel, sender id, profile name)`` of the batch's messages.
    Two Kv reads per 1,000 senders. A sender whose contact exists and whose
    upsert would change nothing (it has a name, or the message brings none) is
    remembered with the batch's upserts, so its messages skip the two reads of
    ``contact_upsert_identity``; the others upsert as before.
    """
    batch = _batch.get()
    if batch is None:
        return
    wanted: dict[tuple[str, str], str | None] = {}
    for channel, sender_id, name in senders:
        address = _address(channel, sender_id)
        if address is not None and (tenant, channel, address) not in batch.contacts:
            wanted.setdefault((channel, address), name)
    if not wanted:
        return
    from crm.selectors import contacts_find_by_identity

    found = contacts_find_by_identity(tenant, list(wanted))
    for ((channel, address), name), contact in zip(wanted.items(), found, strict=True):
        if contact is not None and (contact.name or not name):
            batch.contacts[(tenant, channel, address)] = (name, contact.id)


def _consent_denied(tenant: str, contact_id: str, channel: str, evidence: str) -> None:
    """Deny the contact's marketing consent on ``channel``; skip (with a log line) a contact that was erased.

    The block stays recorded on the conversation either way. An erased contact is
    ``NotFound`` for good, so raising would only dead-letter the event; nothing is
    re-created for it (an erasure that kept a denied consent kept it as a
    suppression entry, ``crm.services.contact_erase``). Any other CRM failure is
    raised, so the journal retries the event.
    """
    try:
        from crm.services import consent_set

        consent_set(
            tenant, contact_id, channel=channel, status="denied", source=f"{channel}:my_chat_member", evidence=evidence
        )
    except NotFound:
        log.info("inbox block not recorded as consent: contact %s was erased; the conversation shows it", contact_id)
    except (DomainError, ImportError) as exc:
        log.warning("inbox consent update failed contact=%s: %s", contact_id, type(exc).__name__)
        _count("errors")
        raise


# -- a journal batch at once ------------------------------------------------------------


def project_batched(
    units: Sequence[Callable[[], object]], *, prefetch: Callable[[InboxStore], None] | None = None
) -> list[Exception | None]:
    """Run ``units`` (each the projection of one journal record) as one batch; return one outcome per unit.

    Over a store that can buffer (``KvInboxStore.buffered``) every unit runs
    in order against the buffered store (``prefetch(store)`` first reads what
    they will need, in one ``get_many``; a prefetch that fails only costs the
    reads); a unit that raises has that exception as its outcome and keeps
    what it wrote before (as when projected alone: its retry is idempotent);
    the others are unaffected. Then the buffered writes go to the Kv as one
    commit per conversation (``BufferedKv.flush``, index upkeep merged like
    every other op), a unit's commits joined with the commits whose writes
    its reads saw (it decided on them) and with those of every earlier unit
    that read a key it sets (that unit decided without it): they land
    together or not at all. The units whose commits or reads fall in a group
    that failed (a writer changed it meanwhile, or the store is unreachable)
    are redone against the store itself, in the batch's order: the units are
    idempotent, so what the other commits wrote is recognised as a duplicate.
    So the outcomes and the store are those of projecting the units one by
    one. A unit's ``after_projection`` effects (metrics, failure logs) run
    once its writes are committed; a redone unit runs its own. Over any other
    store the units simply run one by one.
    """
    store = default_store()
    buffered = getattr(store, "buffered", None)
    if buffered is None:
        return [_outcome(unit) for unit in units]
    from inbox.stores.kv import conversation_of_key

    over: InboxStore = buffered()
    kv = over.kv  # type: ignore[attr-defined]
    batch = _Batch(over)
    token = _batch.set(batch)
    spans: list[tuple[int, int, set[int]]] = []  # per unit: its commits [start, end) and the commits it read
    joined: list[set[int]] = []
    readers: dict[tuple[str, str], list[int]] = {}  # key -> units that read it
    outcomes: list[Exception | None] = []
    try:
        if prefetch is not None:
            try:
                prefetch(over)
            except Exception as exc:  # noqa: BLE001 - only an optimisation: each unit meets (and reports) it itself
                log.info("inbox batch prefetch skipped: %s", type(exc).__name__)
        kv.observed()
        for n, unit in enumerate(units):
            # A unit that fails keeps what it wrote before failing, as one record projected alone does.
            batch.unit, start = n, kv.mark()
            outcomes.append(_outcome(unit))
            end = kv.mark()
            seen, read = kv.observed()
            spans.append((start, end, seen))
            together = set(range(start, end)) | seen
            for key in kv.written(start, end):
                for i in readers.get(key, ()):
                    together.update(range(spans[i][0], spans[i][1]))
            for key in read:
                readers.setdefault(key, []).append(n)
            if len(together) > 1:
                joined.append(together)
    finally:
        _batch.reset(token)
        try:
            groups = kv.flush(conversation_of_key, joined=joined)
        finally:
            kv.forget_cached_states()
    failed = {i for g in groups if g.error is not None for i in g.commits}
    for g in groups:
        if g.error is not None:
            log.info(
                "inbox batch: a conversation's commit failed (%s); its records are projected again",
                type(g.error).__name__,
            )
    redo = {n for n, (start, end, seen) in enumerate(spans) if failed & (set(range(start, end)) | seen)}
    from botmesh_admin.observability import metrics

    with metrics.deferred():  # the batch's counts in one write of the counter store
        for effect, n in batch.effects:
            if n not in redo:
                try:
                    effect()
                except Exception:  # a metric or a log line never fails the records it reports on
                    log.exception("inbox batch: an effect of a projected record failed")
    for n in sorted(redo):
        outcomes[n] = _outcome(units[n])
    return outcomes


def _outcome(unit: Callable[[], object]) -> Exception | None:
    try:
        unit()
    except Exception as exc:  # the unit's record fails alone
        return exc
    return None
