"""Agents' replies through the outbox (ARCHITECTURE §6-7): queued → sending → accepted / failed.

``reply_create`` stores the reply as an outbound message in state ``queued``
and journals an ``inbox.reply`` event on the ``outbox`` channel (idempotency key
per reply). The worker's ``reply_send``:

1. marks the reply ``sending`` **durably, before** the provider request;
2. checks the outbox record's claim (its fencing token, ``Claim.check``: a
   fenced journal ``extend``) **immediately before** the request: a worker
   frozen past its lease (SIGSTOP, a long GC or VM pause) whose record another
   worker took over does not reach the provider — it puts the reply back to
   ``queued`` if nobody touched it meanwhile, and the record goes to whoever
   holds it now (issue 15, item 6);
3. sends through the channel's provider with the reply's idempotency key;
4. records what the channel says the answer means (``result.outcome``,
   ``channels.domain.SendOutcome``): ``accepted`` (with the provider message id,
   then delivery statuses arrive by webhook); ``rate_limited`` (or a retryable
   failure with the provider's delay) is retried after that delay; anything
   else is ``failed`` with the provider's code and title, shown to the agent and
   not retried. ``blocked`` (Telegram 403, "bot was blocked by the user") in a
   private chat also denies the user's consent on the channel
   (``crm.services.contact_blocked_us``), as a campaign send does.

A worker that dies between the request and its record leaves the reply in
``sending``; whoever claims the record next finds it so and marks it
``not_confirmed`` — it is never resent automatically (the customer may have
got it). The agent sees "not confirmed" and may ``reply_resend`` it. A
network error without an answer is ``not_confirmed`` for the same reason.

A stop (SIGTERM: ``shutdown.stopping()``) starts no new reply: the events
worker claims no record after it. The request in flight is counted
(``shutdown.inflight``) until its outcome is recorded, so the drain waits for
it and a forced exit past ``BOTMESH_DRAIN_TIMEOUT`` logs it as cut off.

Times are epoch milliseconds. Logs never carry the text or the chat id.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import TYPE_CHECKING, Any

from botmesh_admin.channels.domain import SendOutcome, SendResult, blocked_identity
from botmesh_admin.clock import now_ms
from botmesh_admin.errors import Conflict, DomainError, NotFound, ValidationError

from .. import selectors
from ..domain import (
    AGENT_RE,
    Conversation,
    Handoff,
    Message,
    Reply,
    conversation_events,
    preview,
    replace,
    reply_id,
    unify_line_breaks,
    validate_agent,
    validate_conversation,
    validate_conversation_id,
    validate_message,
    validate_storable_id,
    validate_storable_text,
    validate_typed_text,
)
from ..stores import default_store
from ..stores.base import STALE, Change, InboxStore, chat_retry
from .projection import _after_message, _merge_placeholder

if TYPE_CHECKING:
    from botmesh_admin.events.worker import Claim

log = logging.getLogger(__name__)

REPLY_EVENT = "inbox.reply"
OUTBOX_CHANNEL = "outbox"
MAX_REPLY = 4096
MAX_INLINE_WAIT_MS = 10_000  # wait this long for a rate limit inside one claim; longer: retry the record


class RetryLater(Exception):
    """The provider asked to slow down; the journal retries the record after its backoff."""


def reply_create(
    tenant: str,
    conversation_id: str,
    *,
    author: str,
    text: str,
    idempotency_key: str | None = None,
    admin: bool = False,
    assign: bool = False,
    assignable: bool = True,
) -> Message:
    """Queue an agent's reply; return its message (state ``queued``).

    ``assignable`` false: ``author`` is an API token, which never becomes the assignee (README,
    "Inbox"): ``assign`` is refused (``ValidationError`` on ``assign``) and a takeover leaves the
    assignee as it was.

    What replying means follows the tenant's ``InboxSettings`` (README, "Inbox"),
    checked and applied in the same write as the reply:

    - in a conversation assigned to another agent the reply is refused with
      ``Conflict`` (409) naming the ``assignee``, unless ``admin`` (the replier
      is a tenant admin), the setting ``reply_to_others``, or ``assign``;
    - ``assign`` ("assign to me and reply") makes ``author`` the assignee;
    - with ``reply_takes_over`` (the default) a reply in a chat the bot is
      handling takes it from the bot: a handoff by ``author`` at this time, and
      an unassigned conversation is assigned to ``author``. The bot sees it at
      ``GET …/handoff/{chat_id}``.

    The same ``idempotency_key`` (a client's retry) returns the first reply and
    sends nothing new; with another text it is refused (``reply.idempotency_key``).
    Raise ``ValidationError`` (``reply.text``…) or ``NotFound``.
    """
    store = default_store()
    validate_agent(author, "author")
    if assign and not assignable:
        raise ValidationError("assign", "a token is not an agent; pass agent=<member> to …/assign first")
    text = validate_typed_text(unify_line_breaks(text), "reply.text", max_len=MAX_REPLY, required=True) or ""
    at = now_ms()
    key = idempotency_key or f"{author}:{at}:{time.perf_counter_ns()}"
    validate_storable_text(key, "reply.idempotency_key", max_len=200, required=True)
    message_id = reply_id(tenant, conversation_id, key)

    def attempt() -> Message:
        existing = store.message_get(tenant, message_id)
        if existing is not None:
            if existing.text != text:  # a key names one reply: reused for another text is a client bug
                raise ValidationError("reply.idempotency_key", "was already used for a reply with another text")
            return existing
        conv = selectors.conversation_get(tenant, conversation_id, store=store)
        settings = store.settings_get(tenant)
        if conv.assignee not in (None, author) and not (admin or assign or settings.reply_to_others):
            raise Conflict(
                f"conversation is assigned to {conv.assignee}; assign it to yourself to reply",
                current_version=conv.version,
                assignee=conv.assignee,
            )
        message = validate_message(
            Message(
                id=message_id,
                conversation_id=conv.id,
                direction="out",
                type="text",
                timestamp_ms=at,
                text=text,
                sender_id=f"agent:{author}",
                sender_name=author,
                source="agent",
                reply=Reply(author=author, state="queued", idempotency_key=key, updated_at_ms=at),
            )
        )
        taken = _replied_by(
            conv, author, at, takes_over=settings.reply_takes_over, assign=assign, assignable=assignable
        )
        new_conv = validate_conversation(_after_message(taken, message, at))
        events = conversation_events(conv, taken, actor=author, at_ms=at)  # the reply's takeover, if any
        store.write(tenant, Change(conversation=new_conv, messages=(message,), previous=conv, events=events))
        _enqueue(tenant, message_id, f"reply:{message_id}")
        log.info(
            "inbox reply %s queued conversation=%s handoff=%s",
            message_id,
            conv.id,
            new_conv.handed_off and not conv.handed_off,
        )
        return store.message_get(tenant, message_id) or message

    return chat_retry(attempt, busy="conversation is too busy; try again")


def _replied_by(
    conv: Conversation, author: str, at: int, *, takes_over: bool, assign: bool, assignable: bool = True
) -> Conversation:
    """Return ``conv`` as ``author``'s reply leaves it: assigned (``assign``), taken from the bot (``takes_over``).

    An agent-facing change (assignee, handoff) moves ``version``, as the assign
    and handoff actions do: an agent acting on what they saw before is told.
    """
    changes: dict[str, Any] = {}
    if assign and conv.assignee != author:
        changes["assignee"] = author
    if takes_over and not conv.handed_off:
        changes["handoff"] = Handoff(True, author, at)
        changes["assignee"] = changes.get("assignee", conv.assignee) or (author if assignable else None)
    if not changes:
        return conv
    return replace(conv, version=conv.version + 1, **changes)


def _enqueue(tenant: str, message_id: str, idempotency_key: str) -> None:
    """Journal the ``inbox.reply`` event of ``message_id`` on ``outbox``; a drain is queued after commit."""
    from botmesh_admin.events.services import event_publish
    from botmesh_admin.observability.tracing import inject_context

    # The agent's request's trace travels along: the send continues it.
    event_publish(
        tenant,
        type=REPLY_EVENT,
        channel=OUTBOX_CHANNEL,
        payload={"message_id": message_id, "trace": inject_context()},
        idempotency_key=idempotency_key,
    )


def _set_reply(tenant: str, message: Message, **changes: Any) -> Message:
    """Compare-and-set the reply state of ``message``; raise ``Conflict`` if it changed meanwhile."""
    assert message.reply is not None
    store = default_store()
    message_changes = changes.pop("fields", {})
    reply = replace(message.reply, updated_at_ms=now_ms(), **changes)
    new = validate_message(replace(message, reply=reply, **message_changes))
    return store.write(tenant, Change(messages=(new,))).messages[0]


def _record_outcome(tenant: str, message: Message, **changes: Any) -> Message:
    """Record what the provider answered, even if the reply moved meanwhile.

    If a slow answer arrives after another worker marked the reply
    ``not_confirmed``, the answer wins: now it is known.
    """
    store = default_store()
    latest = [message]

    def attempt() -> Message:
        try:
            return _set_reply(tenant, latest[-1], **dict(changes, fields=dict(changes.get("fields", {}))))
        except STALE:
            return _moved_on(store, tenant, latest)

    return chat_retry(attempt, busy="reply is too busy; the record will be retried", retry_on=_StillSending)


class _StillSending(Exception):
    """The reply changed under an outcome being recorded but is still sending (or not confirmed): record it again."""


def _moved_on(store: InboxStore, tenant: str, latest: list[Message]) -> Message:
    """Return the reply as stored if another worker moved it past ``sending``; else raise ``_StillSending``.

    ``latest[-1]`` becomes the stored reply, which the next attempt writes over.
    """
    current = store.message_get(tenant, latest[-1].id)
    if current is None or current.reply is None or current.reply.state not in ("sending", "not_confirmed"):
        return current or latest[-1]
    latest.append(current)
    raise _StillSending


def _record_accepted(tenant: str, message: Message, *, provider_message_id: str) -> Message:
    """Record an accepted send: its provider message id, ``sent``, and what webhooks already said of it.

    Meta may post a wamid's ``sent``/``delivered`` statuses before the Graph
    API's answer to the send is recorded; projection keeps them on a
    placeholder (``inbox.services.projection``). This write claims the provider id as
    one of the reply's ids, so either the placeholder is there and is absorbed
    (its furthest status, its reactions; the conversation counts it no more),
    or it comes later and is refused (the id is claimed) and the status goes
    to the reply: one message per provider message id in every interleaving.
    As ``_record_outcome``, the answer wins over a ``not_confirmed`` set meanwhile.
    """
    pid = provider_message_id
    store = default_store()
    latest = [message]

    def attempt() -> Message:
        message = latest[-1]
        assert message.reply is not None
        at = now_ms()
        reply = replace(
            message.reply, state="accepted", error_code=None, error_title=None, retry_at_ms=None, updated_at_ms=at
        )
        new = replace(message, reply=reply, provider_message_id=pid, status="sent", status_at_ms=at)
        holder = store.message_get(tenant, pid)
        stored: Conversation | None = None
        removed: tuple[Message, ...] = ()
        claims: tuple[tuple[str, Message], ...] = ()
        if holder is not None and holder.placeholder and holder.conversation_id == message.conversation_id:
            removed, new = (holder,), _merge_placeholder(new, holder)
            stored = selectors.conversation_get(tenant, message.conversation_id, store=store)
        elif holder is not None and holder.id != message.id:
            log.warning("inbox reply %s: provider id already names message %s; not claimed", message.id, holder.id)
        if holder is None or removed:
            new = replace(new, aliases=tuple(dict.fromkeys((*new.aliases, pid))))
            claims = ((pid, new),)
        try:
            return store.write(
                tenant,
                Change(
                    conversation=None if stored is None else _without(stored, removed[0], new, at),
                    messages=(validate_message(new),),
                    removed=removed,
                    aliases=claims,
                    previous=stored,
                ),
            ).messages[0]
        except STALE:
            return _moved_on(store, tenant, latest)

    return chat_retry(attempt, busy="reply is too busy; the record will be retried", retry_on=_StillSending)


def _without(conv: Conversation, placeholder: Message, reply: Message, now: int) -> Conversation:
    """Return ``conv`` no longer counting ``placeholder`` (absorbed into ``reply``)."""
    changes: dict[str, Any] = {"message_count": max(conv.message_count - 1, 0), "updated_at_ms": now}
    if conv.last_message_id == placeholder.id:  # the status made it the newest: the reply it was stands there
        assert reply.reply is not None
        changes.update(
            last_message_id=reply.id,
            last_text=preview(reply.text),
            last_direction="out",
            last_author=reply.reply.author,
        )
    return validate_conversation(replace(conv, **changes))


def _provider_for(tenant: str, conv: Any) -> Any:
    """Return the provider of the channel that received ``conv`` (never another number or bot).

    A conversation without a channel (stored before conversations belonged to
    one) is sent through the tenant's only channel of its kind; with several,
    or when its channel was deleted, every send fails with the reason (an
    ``UnconfiguredProvider``) instead of going out from another number.
    """
    from botmesh_admin.channels.providers import UnconfiguredProvider, provider_for
    from botmesh_admin.channels.selectors import channel_config_list

    configs = channel_config_list(tenant, kind=conv.channel)
    if conv.channel_name is not None:
        channel = next((c for c in configs if c.name == conv.channel_name), None)
        if channel is None:
            return UnconfiguredProvider(f"the conversation's channel {conv.channel_name!r} is no longer configured")
        return provider_for(tenant, channel)
    if len(configs) > 1:
        return UnconfiguredProvider(
            f"the conversation has no channel and the tenant has {len(configs)} {conv.channel} channels: "
            "run manage.py botmesh_assign_channels"
        )
    return provider_for(tenant, configs[0] if configs else None)


def reply_send(
    tenant: str,
    message_id: str,
    *,
    claim: Claim | None = None,
    sleep: Any = time.sleep,
) -> Message | None:
    """Send a queued reply (the outbox handler); return the message in its new state.

    ``claim`` is the outbox record's claim (``events.worker.current_claim()``):
    its fencing token is checked immediately before every provider request
    (``None``: no journal record, nothing to check — direct calls in tests).
    A reply found ``sending`` was interrupted mid-request by a dead worker:
    mark it ``not_confirmed`` and do not send. Raise ``RetryLater`` when the
    provider's rate limit outlasts ``MAX_INLINE_WAIT_MS`` (the journal retries),
    and ``StaleLeaseError`` when the claim was lost before the request (nothing sent).
    """
    from botmesh_admin.channels.domain import OutboundMessage
    from botmesh_admin.observability.shutdown import inflight

    store = default_store()
    message = store.message_get(tenant, message_id)
    if message is None or message.reply is None:
        return None  # erased meanwhile: nothing to send
    state = message.reply.state
    if state in ("accepted", "failed", "not_confirmed"):
        return message
    if state == "sending":
        log.warning("inbox reply %s found sending after a restart: not confirmed, not resent", message_id)
        return _set_reply(
            tenant,
            message,
            state="not_confirmed",
            error_title="the worker stopped before the provider answered; it may or may not have been delivered",
        )
    conv = selectors.conversation_get(tenant, message.conversation_id, store=store)
    provider = _provider_for(tenant, conv)
    while True:
        wait = (message.reply.retry_at_ms or 0) - now_ms()
        if wait > MAX_INLINE_WAIT_MS:
            raise RetryLater(f"rate limited for {wait} ms more")
        if wait > 0:
            sleep(wait / 1000)
        # Durably "sending" before the request: a crash from here on can never lead to a second send.
        message = _set_reply(tenant, message, state="sending", attempts=message.reply.attempts + 1)
        assert message.reply is not None  # _set_reply keeps it
        outbound = OutboundMessage(
            chat_key=conv.chat_key, text=message.text, idempotency_key=message.reply.idempotency_key
        )
        if claim is not None:
            _check_claim(tenant, message, claim)
        with inflight():  # a SIGTERM's drain waits for the request and its record
            result = provider.send(outbound)
            if result.outcome is SendOutcome.ACCEPTED:
                from botmesh_admin.observability.metrics import count

                count("messages.out")
                return _record_accepted(tenant, message, provider_message_id=result.provider_message_id)
            if result.outcome is SendOutcome.NO_ANSWER:
                # No answer at all: the request may have arrived. Never guess: let the agent decide.
                return _record_outcome(tenant, message, state="not_confirmed", error_title=result.error_title)
            if result.outcome is SendOutcome.RATE_LIMITED or (result.retryable and result.retry_after_ms):
                delay = result.retry_after_ms or 1000
                log.info("inbox reply %s rate limited (%s); retry in %d ms", message_id, result.error_code, delay)
                message = _set_reply(
                    tenant,
                    message,
                    state="queued",
                    error_code=result.error_code,
                    error_title=result.error_title,
                    retry_at_ms=now_ms() + delay,
                )
                continue
            from botmesh_admin.observability.metrics import count

            count("messages.out_failed")
            log.info("inbox reply %s failed with code %s (%s)", message_id, result.error_code, result.outcome)
            failed = _record_outcome(
                tenant,
                message,
                state="failed",
                error_code=result.error_code,
                error_title=result.error_title,
                retry_at_ms=None,
            )
            if result.outcome is SendOutcome.BLOCKED:
                _blocked_us(tenant, conv, message_id, result)
            return failed


def _blocked_us(tenant: str, conv: Conversation, message_id: str, result: SendResult) -> None:
    """Record in the CRM that the user of ``conv`` blocked us (consent denied on its channel, with the evidence).

    Only a private chat is the user's block (``channels.domain.blocked_identity``;
    in a group the bot was removed from the group). The reply is recorded
    ``failed`` first, so a CRM failure cannot leave it ``sending`` (never
    resent): it is logged and counted, and the reply stays failed.
    """
    from crm.services import contact_blocked_us

    identity = blocked_identity(conv.chat_key)
    if identity is None:
        return
    channel = conv.chat_key.partition(":")[0]
    evidence = f"{channel.capitalize()} {result.error_code} to reply {message_id}: {result.error_title or 'blocked'}"
    try:
        contact_blocked_us(tenant, channel=channel, identity=identity, evidence=evidence, source="inbox")
    except DomainError as exc:
        from botmesh_admin.observability.metrics import count

        log.warning("inbox reply %s: the block was not recorded in the CRM: %s", message_id, exc.code)
        count("errors")


def _check_claim(tenant: str, message: Message, claim: Claim) -> None:
    """Check the outbox record's claim before the request; if it was lost, undo ``sending`` and raise.

    The reply was not sent: it goes back to ``queued`` (compare-and-set on the
    ``sending`` this worker wrote) so the record's current holder sends it. If
    the reply moved meanwhile (the new holder found it ``sending`` and marked
    it ``not_confirmed``), it is left as it is. Raise ``StaleLeaseError``.
    """
    from botmesh_admin.events import StaleLeaseError

    try:
        claim.check()
    except StaleLeaseError:
        assert message.reply is not None
        log.warning(
            "inbox reply %s: the outbox record's claim (fencing token %d) was lost before the provider "
            "request; not sent",
            message.id,
            claim.fencing_token,
        )
        try:
            _set_reply(tenant, message, state="queued", attempts=max(message.reply.attempts - 1, 0))
        except Conflict:
            pass  # another worker moved the reply on: it decides now
        raise


def reply_resend(tenant: str, message_id: str, *, conversation_id: str, actor: str) -> Message:
    """Queue a ``not_confirmed`` (or ``failed``) reply of ``conversation_id`` again, at the agent's request.

    The resend uses a new idempotency key, so the provider treats it as a new
    message: the customer may receive it twice, which the agent accepted.
    Raise ``NotFound`` if the reply is not one of ``conversation_id``'s (an
    agent acting on conversation A never resends conversation B's reply) and
    ``ValidationError`` (``reply.state``) if it is not resendable.
    """
    store = default_store()
    validate_agent(actor, "actor")
    message = store.message_get(tenant, message_id)
    if message is None or message.reply is None or message.conversation_id != conversation_id:
        raise NotFound(f"reply {message_id} not found in conversation {conversation_id}")
    if message.reply.state not in ("not_confirmed", "failed"):
        raise ValidationError(
            "reply.state", f"is {message.reply.state}; only a not confirmed or failed reply can be resent"
        )
    attempt = message.reply.attempts + 1
    key = f"{message.reply.idempotency_key[:180]}:resend{attempt}"
    queued = _set_reply(
        tenant, message, state="queued", idempotency_key=key, error_code=None, error_title=None, retry_at_ms=None
    )
    _enqueue(tenant, message_id, f"reply:{message_id}:resend{attempt}")
    log.info("inbox reply %s resent by agent", message_id)
    return queued


# -- bots' replies ----------------------------------------------------------------------

BOT_FENCES = "bot_fences"
"""The tenant's Kv collection of the highest turn fence that replied in each chat, per bot."""


MAX_FENCE = 2**53
"""Fences are below this: JSON numbers every client (JavaScript's included) reads exactly."""


def _bot_sender_id(bot: str) -> str:
    """Return the reply's ``sender_id``: ``bot:<bot>``, or ``bot:<sha256 prefix>`` when the bot id is no message id.

    A bot id is any Unicode text (``validate_bot_id``: spaces, ``/``), a message
    id is not (``validate_storable_id``); such a bot still answers.
    """
    sender = f"bot:{bot}"
    try:
        return validate_storable_id(sender, "sender_id")
    except ValidationError:
        return f"bot:{hashlib.sha256(bot.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}"


def bot_reply_create(
    tenant: str,
    conversation_id: str,
    *,
    bot: str,
    in_reply_to: str,
    text: str,
    fence: int,
) -> tuple[Message, bool]:
    """Queue ``bot``'s answer to the inbound message ``in_reply_to``; return ``(message, created)``.

    The reply goes through the outbox as an agent's does (the same worker, the
    channel's provider — the console provider in the embedded default) but as
    the bot: no handoff, no assignee. Its idempotency key is
    ``bot:<bot>:<in_reply_to>``, so a message is answered once however many
    replicas try: the second gets the first reply back (``created`` False).

    ``fence`` is the fence of the bot replica's turn on the chat
    (``Coordinator.acquire_turn``). It must not be older than a fence that already
    replied in this chat for this bot (``fencing.FenceGuard`` over the tenant's
    ``bot_fences`` collection): a replica frozen past its turn's lease, whose
    turn another replica took, gets ``StaleFence`` (409 ``stale_fence``, the
    highest fence as ``current_version``) and nothing is queued.

    Everything is validated before anything is written (the fence entry
    included): a refused request leaves no trace. The fence guard's commit is the
    last check before the message write; it is not atomic with it (the fence lives
    in the Kv, the message in the inbox store), so a write that then loses a race
    may leave the fence raised — harmless, the fence was this replica's own.

    Raise ``NotFound`` for an unknown conversation or ``in_reply_to`` (or one of
    another conversation), ``ValidationError`` naming ``conversation_id`` or
    ``in_reply_to`` for a malformed id, ``in_reply_to`` for an outbound message,
    ``fence`` unless it is an int with ``0 < fence < 2**53`` (a JSON number every
    client reads exactly; an unbounded one from a buggy replica would make every
    later reply in the chat stale) and ``text`` for bad text, and ``Conflict``
    (409 ``handed_off``) while a human holds the chat.
    """
    from botmesh_admin.coordination.base import StaleFence
    from botmesh_admin.coordination.fencing import FenceGuard
    from botmesh_admin.kv import TenantKv
    from botmesh_admin.kv.runtime import default_kv

    store = default_store()
    if isinstance(fence, bool) or not isinstance(fence, int) or not 0 < fence < MAX_FENCE:
        raise ValidationError("fence", "must be an integer with 0 < fence < 2**53 (the fence of the replica's turn)")
    text = validate_typed_text(unify_line_breaks(text), "text", max_len=MAX_REPLY, required=True) or ""
    validate_conversation_id(conversation_id, "conversation_id")
    validate_storable_id(in_reply_to, "in_reply_to")
    conv = selectors.conversation_get(tenant, conversation_id, store=store)
    inbound = store.message_get(tenant, in_reply_to)
    if inbound is None or inbound.conversation_id != conv.id:
        raise NotFound(f"message {in_reply_to!r} of this conversation not found")
    if inbound.direction != "in":
        raise ValidationError("in_reply_to", "must be an inbound message")
    key = f"bot:{bot}:{in_reply_to}"
    message_id = reply_id(tenant, conversation_id, key)
    kv = default_kv()
    guard = FenceGuard(kv, TenantKv(kv, "inbox").table(tenant, BOT_FENCES))
    resource = f"{hashlib.sha256(bot.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}/{conv.id}"

    def attempt() -> tuple[Message, bool]:
        existing = store.message_get(tenant, message_id)
        if existing is not None:
            if guard.highest(resource) > fence:  # the late replica is told, even if the answer went out
                raise StaleFence(
                    f"fence {fence} is older than the fence that replied in this chat",
                    current_version=guard.highest(resource),
                )
            return existing, False
        conv = selectors.conversation_get(tenant, conversation_id, store=store)
        if conv.handed_off:
            raise HandedOff(f"a human ({conv.handoff.taken_by if conv.handoff else '?'}) holds this chat")
        at = now_ms()
        author = bot if AGENT_RE.fullmatch(bot) else "bot"
        message = validate_message(
            Message(
                id=message_id,
                conversation_id=conv.id,
                direction="out",
                type="text",
                timestamp_ms=at,
                text=text,
                sender_id=_bot_sender_id(bot),
                sender_name=bot[:200],
                source="bot",
                reply_to=in_reply_to,
                reply=Reply(author=author, state="queued", idempotency_key=key[:200], updated_at_ms=at),
            )
        )
        new_conv = validate_conversation(_after_message(conv, message, at))
        # The last check before the write, after every validation (nothing half written): raises
        # StaleFence before anything is written; a later fence that replies meanwhile makes this
        # one stale for every later reply too (the fence entry only grows).
        guard.commit(resource, fence)
        store.write(tenant, Change(conversation=new_conv, messages=(message,), previous=conv))
        _enqueue(tenant, message_id, f"reply:{message_id}")
        log.info("inbox bot reply %s queued conversation=%s fence=%s", message_id, conv.id, fence)
        return store.message_get(tenant, message_id) or message, True

    return chat_retry(attempt, busy="conversation is too busy; try again")


class HandedOff(Conflict):
    """A human holds the chat: the bot must not answer it. HTTP 409."""

    code = "handed_off"
