"""Inbox writes: projection entry points, assignment, handoff, status, notes, read markers, erasure.

The module-level functions (``conversation_assign(tenant, conversation_id, *, ...)``…)
are the one public surface the API, views and tasks call, over ``default_store()``
and the kernel clock (``botmesh_admin.clock.now_ms``). Every write
is validated before it reaches the store; conversations changed by several
writers at once are updated by read → compare-and-set → retry. Replies through
the outbox live in ``inbox.services.replies``.

Times are epoch milliseconds. Logs carry conversation ids, never chat ids.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from botmesh_admin.clock import now_ms
from botmesh_admin.errors import Conflict, NotFound, ValidationError

from .. import selectors
from ..domain import (
    CONVERSATION_STATUSES,
    Conversation,
    Handoff,
    InboxSettings,
    Note,
    ReadMarker,
    StoredMessage,
    conversation_events,
    inbound_event_problem,
    new_note_id,
    replace,
    unify_line_breaks,
    validate_agent,
    validate_choice,
    validate_conversation,
    validate_conversation_id,
    validate_conversation_version,
    validate_marker,
    validate_ms,
    validate_note,
    validate_storable_id,
)
from ..stores import default_store
from ..stores.base import Change, InboxStore, chat_retry
from . import projection
from .projection import Projected

log = logging.getLogger(__name__)

PURGE_BATCH = 500


def message_project(tenant: str | None, record: StoredMessage | Mapping[str, Any]) -> Projected:
    """Project a bot's ledger record (a ``StoredMessage`` or its JSON object).

    Without an explicit tenant the record's ``tenantId`` is used; a record
    naming another tenant than ``tenant`` is refused (``ValidationError`` on
    ``record.tenantId``). Idempotent by message id.
    """
    message = record if isinstance(record, StoredMessage) else StoredMessage.from_json(record)
    target = tenant or message.tenant_id
    if target is None:
        raise ValidationError("record.tenantId", "is required when no tenant is given")
    if message.tenant_id is not None and message.tenant_id != target:
        raise ValidationError("record.tenantId", "names another tenant")
    return projection.project_stored(target, message)


def event_project(tenant: str, event: Any) -> Projected:
    """Project a channel event (``InboundMessage``, ``StatusUpdate`` or ``MemberUpdate``).

    An event whose ids the inbox can never store (``inbound_event_problem``;
    journaled before the webhook refused them) is skipped with a log line
    (``ignored``) rather than failing its whole record into the dead letters.
    """
    problem = inbound_event_problem(event)
    if problem is not None:
        log.warning("inbox event skipped, it can never be stored: %s", problem.message)
        return Projected("ignored")
    kind = getattr(event, "kind", None)
    if kind == "message":
        return projection.project_inbound(tenant, event)
    if kind == "status":
        return projection.project_status(tenant, event)
    if kind == "member":
        return projection.project_member(tenant, event)
    raise ValidationError("event.kind", "must be message, status or member")


# -- conversation changes ---------------------------------------------------------------


def _conversation_change(
    tenant: str,
    conversation_id: str,
    change: Callable[[Conversation], Conversation | None],
    *,
    expected_version: int | None = None,
    actor: str | None = None,
) -> Conversation:
    """Apply ``change`` by compare-and-set, retrying while only the store revision moved.

    With ``expected_version`` the agent-facing version must still match,
    else ``Conflict`` carries ``current_version`` and the current assignee.
    What changed (assignee, handoff, status) is recorded in the same write
    as the conversation's events, by ``actor`` (``None``: the system).
    """
    store = default_store()

    def attempt() -> Conversation:
        conv = selectors.conversation_get(tenant, conversation_id, store=store)
        if expected_version is not None and conv.version != expected_version:
            raise Conflict(
                f"conversation changed: expected version {expected_version}, found {conv.version}",
                current_version=conv.version,
                assignee=conv.assignee,
                status=conv.status,
            )
        new = change(conv)
        if new is None:
            return conv
        at = now_ms()
        new = validate_conversation(replace(new, version=conv.version + 1, updated_at_ms=at))
        events = conversation_events(conv, new, actor=actor, at_ms=at)
        written = store.write(tenant, Change(conversation=new, previous=conv, events=events))
        return written.conversation or new

    return chat_retry(attempt, busy="conversation is too busy; try again")


def conversation_assign(
    tenant: str, conversation_id: str, *, agent: str | None, expected_version: int, actor: str | None = None
) -> Conversation:
    """Assign the conversation to ``agent`` (``None``: unassign) if its version is ``expected_version``.

    Compare-and-set: a stale version raises ``Conflict`` (HTTP 409) with the
    current ``version`` and ``assignee``. Return the conversation at its new version.
    ``actor``: who assigned it (the thread's event names them).
    """
    if agent is not None:
        validate_agent(agent, "agent")
    validate_conversation_version(expected_version, "expected_version")
    conv = _conversation_change(
        tenant,
        conversation_id,
        lambda c: replace(c, assignee=agent),
        expected_version=expected_version,
        actor=actor,
    )
    log.info("inbox assign conversation=%s version=%s", conversation_id, conv.version)
    return conv


def conversation_handoff(
    tenant: str,
    conversation_id: str,
    *,
    active: bool,
    actor: str,
    expected_version: int | None = None,
    assignable: bool = True,
) -> Conversation:
    """Take the chat from the bot (``active``) or give it back; stored with who and when.

    Taking an unassigned conversation assigns it to ``actor`` — unless not ``assignable``
    (an API token: never an assignee, README "Inbox"), when the assignee stays as it was.
    Taking a chat that is already handed off, or giving back one that is not, changes nothing.
    """
    validate_agent(actor, "actor")

    def change(c: Conversation) -> Conversation | None:
        if active == c.handed_off:
            return None
        at = now_ms()
        if active:
            return replace(c, handoff=Handoff(True, actor, at), assignee=c.assignee or (actor if assignable else None))
        assert c.handoff is not None
        return replace(c, handoff=replace(c.handoff, active=False, released_by=actor, released_at_ms=at))

    conv = _conversation_change(tenant, conversation_id, change, expected_version=expected_version, actor=actor)
    log.info("inbox handoff conversation=%s active=%s", conversation_id, active)
    return conv


def conversation_status_set(
    tenant: str,
    conversation_id: str,
    *,
    status: str,
    snoozed_until_ms: int | None = None,
    expected_version: int | None = None,
    actor: str | None = None,
) -> Conversation:
    """Set open / pending / resolved; ``snoozed_until_ms`` (pending only) reopens it at that time.

    ``actor``: who set it (the thread's event names them).
    """
    validate_choice(status, "status", CONVERSATION_STATUSES)
    if snoozed_until_ms is not None:
        validate_ms(snoozed_until_ms, "snoozed_until_ms")
        if status != "pending":
            raise ValidationError("snoozed_until_ms", "only a pending conversation can be snoozed")
        if snoozed_until_ms <= now_ms():
            raise ValidationError("snoozed_until_ms", "must be in the future (epoch milliseconds)")

    def change(c: Conversation) -> Conversation | None:
        if c.status == status and c.snoozed_until_ms == snoozed_until_ms:
            return None
        return replace(c, status=status, snoozed_until_ms=snoozed_until_ms)

    return _conversation_change(tenant, conversation_id, change, expected_version=expected_version, actor=actor)


# -- notes and read markers ---------------------------------------------------------------


def note_add(tenant: str, conversation_id: str, *, author: str, text: str) -> Note:
    """Add a private note; return it. Raise ``ValidationError`` (``note.text``) or ``NotFound``."""
    validate_conversation_id(conversation_id)
    text = unify_line_breaks(text)
    note = validate_note(Note(new_note_id(now_ms()), conversation_id, author, text, now_ms()))
    return default_store().note_add(tenant, note)


def read_marker_set(tenant: str, conversation_id: str, *, agent: str, message_id: str | None = None) -> ReadMarker:
    """Move ``agent``'s read marker to ``message_id`` (default: the newest message); forward only.

    A marker never moves back: marking an older message returns the marker
    unchanged. Raise ``NotFound`` if the message is not in this conversation.
    """
    validate_agent(agent, "agent")
    store = default_store()

    def attempt() -> ReadMarker:
        conv = selectors.conversation_get(tenant, conversation_id, store=store)
        target = message_id or conv.last_message_id
        if target is None:
            raise NotFound("the conversation has no messages")
        message = store.message_get(tenant, validate_storable_id(target, "message_id"))
        if message is None or message.conversation_id != conversation_id:
            raise NotFound(f"message {target} not found in this conversation")
        current = store.marker_get(tenant, conversation_id, agent)
        if current is not None and current.message_sort_key >= message.sort_key:
            return current
        marker = validate_marker(
            ReadMarker(
                conversation_id,
                agent,
                message.id,
                message.sort_key,
                now_ms(),
                revision=0 if current is None else current.revision,
            )
        )
        return store.marker_put(tenant, marker)

    return chat_retry(attempt, busy="read marker is too busy; try again")


def read_markers_backfill(tenant: str, *, batch: int = 200) -> int:
    """Give read markers stored before unread counts existed their count; return the records changed."""
    store = default_store()
    changed = 0
    while (done := store.markers_backfill(tenant, limit=batch)) > 0:
        changed += done
    return changed


# -- erasure ------------------------------------------------------------------------------


def conversation_erase(tenant: str, conversation_id: str) -> int:
    """Erase the conversation, its messages, notes and read markers; return the records removed.

    The conversation goes first (new messages of the chat then start a new
    conversation), then the rest in batches. A purge cut short is finished
    by erasing again. Raise ``NotFound`` if there is nothing to erase.
    """
    validate_conversation_id(conversation_id)
    store = default_store()

    def delete() -> None:
        conv = store.conversation_get(tenant, conversation_id)
        if conv is None:
            if not store.erasure_pending(tenant, conversation_id):
                raise NotFound(f"conversation {conversation_id} not found")
            return  # deleted before, its purge cut short: finish it
        store.conversation_delete(tenant, conv)

    chat_retry(delete, busy="conversation is too busy; try again")
    removed = 1
    while (batch := store.conversation_purge(tenant, conversation_id, limit=PURGE_BATCH)) > 0:
        removed += batch
    log.info("inbox erased conversation=%s records=%d", conversation_id, removed)
    return removed


def conversation_channels_assign(
    tenant: str,
    *,
    names: Mapping[str, str],
    after: str | None = None,
    limit: int = 200,
) -> tuple[dict[str, int], str | None]:
    """Assign one page of the tenant's conversations without a channel to their channel.

    ``names`` maps a kind (``whatsapp``, ``telegram``) to the channel name its
    conversations from before belong to (``botmesh_assign_channels`` passes the
    tenant's only channel of each kind, or what the operator named). Walks the
    conversation list (newest activity first) from ``after``; each assignment is
    a compare-and-set of the conversation (retried; the agent-facing version
    and the store key stay: such a conversation stays ``keyed_by_chat_only``).
    Idempotent: an assigned conversation is skipped. Return ``({"checked",
    "assigned", "left"}, the cursor of the next page or None)``.
    """
    store = default_store()
    page, cursor = store.conversation_page(tenant, after=after, limit=limit)
    counts = {"checked": len(page), "assigned": 0, "left": 0}
    for conv in page:
        if conv.channel_name is not None:
            continue
        name = names.get(conv.channel)
        if name is None:
            counts["left"] += 1
            continue
        counts["assigned"] += chat_retry(
            lambda: _channel_assign(store, tenant, conv.id, name),  # noqa: B023 - called at once
            busy=f"conversation {conv.id} is too busy; run the command again",
        )
    return counts, cursor


def _channel_assign(store: InboxStore, tenant: str, conversation_id: str, name: str) -> int:
    """Put the conversation on channel ``name`` unless it is gone or has a channel; return 1 if it changed."""
    current = store.conversation_get(tenant, conversation_id)
    if current is None or current.channel_name is not None:
        return 0
    store.write(
        tenant, Change(conversation=validate_conversation(replace(current, channel_name=name)), previous=current)
    )
    return 1


def inbox_settings_set(
    tenant: str,
    *,
    reply_takes_over: bool | None = None,
    reply_to_others: bool | None = None,
    store: InboxStore | None = None,
) -> InboxSettings:
    """Change what replying means in ``tenant`` (``None``: keep); return the settings stored.

    Read → compare-and-set → retry, so two admins changing different settings
    keep both. Raise ``ValidationError`` naming a field that is not a boolean.
    """
    for name, value in (("reply_takes_over", reply_takes_over), ("reply_to_others", reply_to_others)):
        if value is not None and not isinstance(value, bool):
            raise ValidationError(name, "must be true or false")
    store = store or default_store()

    def attempt() -> InboxSettings:
        current = store.settings_get(tenant)
        new = replace(
            current,
            reply_takes_over=current.reply_takes_over if reply_takes_over is None else reply_takes_over,
            reply_to_others=current.reply_to_others if reply_to_others is None else reply_to_others,
        )
        return store.settings_put(tenant, new)

    stored = chat_retry(attempt, busy="inbox settings are too busy; try again")  # two admins saving at once
    log.info(
        "inbox settings of %s: reply_takes_over=%s reply_to_others=%s",
        tenant,
        stored.reply_takes_over,
        stored.reply_to_others,
    )
    return stored


def conversations_wake(tenant: str, *, at_ms: int | None = None, batch: int = 200) -> int:
    """Store as ``open`` every pending conversation snoozed until ``at_ms`` (default: now); return how many.

    The agent-facing ``version`` does not move: agents already see such a
    conversation as open (``selectors.effective_status``), so an action
    based on what they saw still applies. Reads O(woken) entries.
    """
    store = default_store()
    now = now_ms() if at_ms is None else at_ms
    woken = 0
    while True:
        due = store.snoozed_due(tenant, now_ms=now, limit=batch)
        moved = sum(_conversation_wake(store, tenant, c, now) for c in due)
        woken += moved
        if len(due) < batch or not moved:
            return woken


def _conversation_wake(store: InboxStore, tenant: str, conv: Conversation | None, now: int) -> int:
    """Reopen ``conv`` if it is still snoozed until ``now`` or earlier; return 1 if it was (0: nothing to do)."""
    if conv is None:
        return 0
    read = [conv]  # the first attempt uses the conversation the due list gave

    def attempt() -> int:
        current = read.pop() if read else store.conversation_get(tenant, conv.id)
        due = current is not None and current.status == "pending" and current.snoozed_until_ms is not None
        if current is None or not due or (current.snoozed_until_ms or 0) > now:
            return 0
        at = now_ms()
        new = validate_conversation(replace(current, status="open", snoozed_until_ms=None, updated_at_ms=at))
        events = conversation_events(current, new, actor=None, at_ms=at)  # the system reopened it
        store.write(tenant, Change(conversation=new, previous=current, events=events))
        return 1

    return chat_retry(attempt, busy="conversation is too busy; the wake-up job will try again")


def inbox_tick(*, at_ms: int | None = None) -> dict[str, int]:
    """Run the inbox's periodic work over every tenant; return ``{"woken", "backfilled", "skipped"}``.

    Called by the durable scheduled job ``inbox.tick`` every ``TICK_EVERY_S``
    seconds: reopens snoozed conversations whose time has come and backfills
    read markers stored before unread counts existed. Idempotent. A tenant
    whose indexes are not built yet (``manage.py botmesh_reindex``) is skipped.
    """
    from botmesh_admin.kv.indexes import IndexNotBuilt
    from botmesh_admin.tenancy.selectors import tenant_ids

    counts = {"woken": 0, "backfilled": 0, "skipped": 0}
    for tenant in tenant_ids():
        try:
            counts["woken"] += conversations_wake(tenant, at_ms=at_ms)
            counts["backfilled"] += read_markers_backfill(tenant)
        except IndexNotBuilt:
            counts["skipped"] += 1
    if counts["skipped"]:
        log.warning(
            "inbox.tick skipped %d tenant(s) with unbuilt indexes; run manage.py botmesh_reindex", counts["skipped"]
        )
    return counts


# -- the ledger push ---------------------------------------------------------------------

MAX_LEDGER_RECORDS = 5000
LEDGER_EVENT = "ledger.message"
INBOUND_CHANNEL = "inbound"
LEDGER_CHANNEL = "ledger"
"""Ledger pushes have their own journal channel (and drain): a bot's bulk history never queues
ahead of a customer's live webhook on ``inbound``."""


LEDGER_BODY_SHAPES = "a JSON array of records, or JSON lines (one record object a line)"
# Keys only a StoredMessage record has: a one-line object without any of them is a wrapper, not a record.
_RECORD_KEYS = frozenset({"id", "chatId", "channel", "senderId", "timestamp"})


def ledger_parse(body: bytes) -> list[Any]:
    """Return the records of a ledger push: a JSON array, or JSON lines (one object a line).

    Raise ``ValidationError`` naming ``body`` for a body of neither shape (not
    UTF-8, empty, one JSON object over several lines, or an object wrapping the
    records such as ``{"records": [...]}``), ``records`` for too many records
    and ``records[i]`` (0-based) for a line that is not JSON.
    """
    from botmesh_admin.jsonbody import json_load

    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ValidationError("body", "is not UTF-8") from None
    stripped = text.strip()
    if not stripped:
        raise ValidationError("body", f"has no records: send {LEDGER_BODY_SHAPES}")
    if stripped.startswith("{"):
        _refuse_wrapped_records(stripped)
    if stripped.startswith("["):
        records = json_load(stripped, field="records")
        if not isinstance(records, list):
            raise ValidationError("records", "must be a JSON array or JSON lines")
    else:
        records = [
            json_load(line, field=f"records[{i}]")
            for i, line in enumerate(line for line in stripped.splitlines() if line.strip())
        ]
    if len(records) > MAX_LEDGER_RECORDS:
        raise ValidationError("records", f"at most {MAX_LEDGER_RECORDS} records per push")
    return records


def _refuse_wrapped_records(text: str) -> None:
    """Raise ``ValidationError`` naming ``body`` if ``text`` is one JSON object that is not a
    one-line record (checking its records would name ``records[0].channel`` for the wrong cause)."""
    from botmesh_admin.jsonbody import json_load

    try:
        whole = json_load(text, field="body")
    except ValidationError:
        return  # not one JSON value: JSON lines, judged line by line
    if not isinstance(whole, dict):
        return
    if not _RECORD_KEYS & whole.keys():
        wrapped = [k for k, v in whole.items() if isinstance(v, list)]
        hint = f" (send the array under {wrapped[0]!r} itself)" if wrapped else ""
        raise ValidationError("body", f"must be {LEDGER_BODY_SHAPES}, not an object wrapping them{hint}")
    if "\n" in text:
        raise ValidationError("body", f"must be {LEDGER_BODY_SHAPES}: this record spans several lines")


def _with_channel(record: StoredMessage, names: list[str], field: str) -> StoredMessage:
    """Return ``record`` on its channel configuration: the one it names (which must be one of
    ``names``, the tenant's channels of its kind), else the tenant's only one of that kind.

    With several channels of the kind and none named, the record keeps no
    channel (its chat's conversation without a channel): never a guessed number.
    """
    if record.channel_name is not None:
        if record.channel_name not in names:
            raise ValidationError(field, f"is not a {record.channel} channel of this tenant")
        return record
    return replace(record, channel_name=names[0]) if len(names) == 1 else record


def ledger_push(tenant: str, records: list[Any]) -> dict[str, int]:
    """Validate every record, then journal them in one batch (channel ``ledger``, type ``ledger.message``).

    Nothing is journaled if any record is invalid: ``ValidationError`` names it
    (``records[3].timestamp``, ``records[0].channelName``). A record without
    ``tenantId`` belongs to ``tenant``; one naming another tenant is refused.
    A record without ``channelName`` is on the tenant's only channel of its
    kind (see ``_with_channel``). The idempotency key is
    the message id, so a pushed-again record is counted in ``duplicates``.
    Return ``{"records", "accepted", "duplicates"}``; a worker projects them.
    """
    from botmesh_admin.channels.selectors import channel_config_list
    from botmesh_admin.events.services import NewEvent, event_publish_many
    from botmesh_admin.observability.tracing import linked_carrier

    names_of_kind: dict[str, list[str]] = {}
    for channel in channel_config_list(tenant):
        names_of_kind.setdefault(channel.kind, []).append(channel.name)
    parsed = []
    for i, data in enumerate(records):
        record = StoredMessage.from_json(data, f"records[{i}]")
        if record.tenant_id is not None and record.tenant_id != tenant:
            raise ValidationError(f"records[{i}].tenantId", "names another tenant than the token's")
        parsed.append(_with_channel(record, names_of_kind.get(record.channel, []), f"records[{i}].channelName"))
    # Each record's projection is a trace of its own, linked to the push's (a push of 480
    # records was one trace of 483 spans, credited to one conversation).
    carrier = linked_carrier()
    _name_on_span("botmesh.records", len(parsed))
    # One journal commit for the whole push (MAX_LEDGER_RECORDS is the journal's MAX_BATCH); a drain of
    # ``ledger`` is queued once, after commit, if anything new was appended.
    published = event_publish_many(
        tenant,
        [
            NewEvent(
                type=LEDGER_EVENT,
                channel=LEDGER_CHANNEL,
                payload={"record": replace(record, tenant_id=tenant).to_json(), "trace": carrier},
                idempotency_key=record.id,
            )
            for record in parsed
        ],
    )
    accepted = sum(p.new for p in published)
    return {"records": len(parsed), "accepted": accepted, "duplicates": len(parsed) - accepted}


def _name_on_span(attribute: str, value: int) -> None:
    """Set ``attribute`` on the current span (the push's request), if it records."""
    from opentelemetry import trace

    current = trace.get_current_span()
    if current.is_recording():
        current.set_attribute(attribute, value)
