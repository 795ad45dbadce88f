"""``send_campaign``: send a planned campaign through the channel's broadcast, never twice to one recipient.

Part of the services layer (it writes through the stores). One batch at a time:

1. look at each contact again (``Planner.check_many``, one CRM ``get_many``
   per batch: consent withdrawn since the plan → ``dropped``) and run the
   bot's send hooks (a reason → ``dropped``, reserved and dropped in one
   write); the contacts of the next batch are read while this one is out;
2. wait for the channel's throttle (booked in the store, shared by every process);
3. reserve the available slots and mark them ``sending`` in one write
   (``SlotStore.slots_reserve(..., sending=True)``; a slot another sender holds,
   or whose request already left, is never taken) — *before* the requests
   leave, so a sender that dies now leaves them ``sending``: found later with
   no answer recorded, they become ``in_doubt`` and are never resent automatically;
4. ``provider.broadcast(messages)`` and record each result on the slot of its
   destination chat (the result's ``chat_key``, whatever canonical id the
   provider answers with): accepted (provider id), failed (code, retryable
   or not; retryable ones are due again after the provider's delay), in doubt
   (no answer: the provider may have it), all in one write
   (``SlotStore.slots_record``). If ``broadcast`` itself raises,
   every slot of the batch is released and the error propagates.

The answers of a batch are written while the next batch is out (the broadcast
runs on a helper thread, the write on the caller's): one write per batch hides
behind the network. They are always written before the next page of slots is
read and before ``send_campaign`` returns or raises (an answer that stops the
campaign, or asks to slow down, is written at once, so the next batch sees
it). A write that fails propagates once the batch out has come back (whose
answers get one more try); slots left unwritten stay ``sending`` and become
``in_doubt``, as after a crash: never resent.

What an answer means is the channel's ``result.outcome`` (``channels.domain.SendOutcome``):
``no_answer`` is in doubt; ``bad_credentials`` stops the campaign; ``blocked``
(Telegram 403, "bot was blocked by the user") also denies the recipient's consent on
the channel through ``crm.services.contact_blocked_us``. Times are epoch milliseconds; ``ttl_ms`` must
be longer than a provider request can take plus the next batch's reservation (a batch's answers
are written while the next batch is out, and before any throttle wait).

A stop (SIGTERM: ``shutdown.stopping()``) is checked before each batch and
again right before its slots are reserved (after the throttle's wait): no new
batch starts after it, the batch in flight finishes and is recorded, and the
call returns ``stopped`` with the rest still pending for the next run.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from botmesh_admin.channels.domain import OutboundMessage, SendOutcome, SendResult, Template
from botmesh_admin.channels.providers import Provider
from botmesh_admin.errors import DomainError
from botmesh_admin.observability import metrics
from botmesh_admin.observability.shutdown import inflight, stopping
from botmesh_admin.observability.tracing import span
from crm.domain import Contact

from ..domain import (
    OPEN_STATES,
    REASON_RE,
    Campaign,
    Delivery,
    Failure,
    Recipient,
    new_token,
    now_ms,
)
from ..domain.planning import Planner
from ..stores.base import CampaignStore, SlotStore

log = logging.getLogger("botmesh.campaigns")

SendHook = Callable[[Recipient, OutboundMessage], "str | None"]
"""A send hook returns a reason to drop the message (``"handoff"``), or ``None`` to let it go."""

PAGE = 500
MAX_IDLE_WAIT_MS = 1000


@dataclass(frozen=True)
class CampaignBot:
    """What sends a campaign: the channel's provider and the bot's send hooks."""

    provider: Provider
    hooks: tuple[SendHook, ...] = ()


@dataclass(frozen=True)
class SendOptions:
    """How to send: batch size, slot lease (ms), throttle (messages/s, ``None`` = none), attempts."""

    batch_size: int = 50
    ttl_ms: int = 60_000
    rate_per_s: float | None = None
    throttle_key: str = "default"
    max_attempts: int = 3


class RunControl(Protocol):
    """Asked between batches whether to go on (the campaign may be paused or cancelled)."""

    def keep_going(self) -> bool:
        """Return False to stop after the current batch."""
        ...


class _Always:
    def keep_going(self) -> bool:
        return True


class _StopOnShutdown:
    """Stops when the process was told to stop (SIGTERM), else asks the caller's control."""

    def __init__(self, control: RunControl) -> None:
        self.control = control

    def keep_going(self) -> bool:
        return not stopping() and self.control.keep_going()


class BroadcastFailed(RuntimeError):
    """The provider's ``broadcast`` raised; the batch's slots were released."""


@dataclass
class SendReport:
    """What one ``send_campaign`` call did (counts of slots), and why it returned."""

    accepted: int = 0
    failed: int = 0
    retrying: int = 0
    dropped: int = 0
    in_doubt: int = 0
    finished: bool = False
    stopped: bool = False
    fatal: str | None = None
    drop_reasons: dict[str, int] = field(default_factory=dict)


def send_campaign(
    bot: CampaignBot,
    planner: Planner,
    *,
    tenant: str,
    campaign: Campaign,
    slots: SlotStore,
    campaigns: CampaignStore | None = None,
    options: SendOptions | None = None,
    control: RunControl | None = None,
    clock: Callable[[], int] = now_ms,
    sleep: Callable[[float], None] = time.sleep,
) -> SendReport:
    """Send ``campaign`` to every planned slot that is still open; return when none is, or when told to stop.

    Slots other senders hold are waited for (their lease); retryable failures
    are retried when due. ``finished`` is True when no slot is pending,
    reserved or sending any more. Raise ``BroadcastFailed`` if the provider's
    broadcast raised (after releasing the batch). Every answer that came back
    is written before this returns or raises (module docstring: the overlap).
    """
    options = options or SendOptions()
    run = _Run(bot, planner, tenant, campaign, slots, campaigns, options, clock, sleep)
    try:
        _send_all(run, _StopOnShutdown(control or _Always()))
    except BaseException:
        run.abandon()
        raise
    run.settle()
    return run.report


def _send_all(run: _Run, control: RunControl) -> None:
    """The loop of ``send_campaign`` (``run.report`` says how it ended); the last batch's answers may be pending."""
    tenant, campaign, slots, options, clock = run.tenant, run.campaign, run.slots, run.options, run.clock
    while True:
        wake_at: int | None = None
        if not control.keep_going():
            run.report.stopped = True
            return
        for read, page in enumerate(_open_pages(slots, tenant, campaign.id)):
            if read and not control.keep_going():
                run.report.stopped = True
                return
            now = clock()
            stale = [(d, "sender_lost") for d in page if d.stale_sending(now)]
            if stale:
                run.report.in_doubt += len(
                    slots.slots_mark_in_doubt(tenant, campaign.id, stale, now_ms=now, expired_only=True)
                )
            for d in page:
                if d.state in ("pending", "reserved", "sending") and not d.available(now) and not d.stale_sending(now):
                    due = d.not_before if d.state == "pending" else d.lease_until
                    wake_at = min(wake_at or due or now, due or now)
            candidates = [d for d in page if d.available(now)]
            chunks = [candidates[i : i + options.batch_size] for i in range(0, len(candidates), options.batch_size)]
            # The next batch's contacts are read while this one is out (reads only; at most one batch older).
            checks = run.start_checks(chunks[0]) if chunks else None
            for index, chunk in enumerate(chunks):
                if index and not control.keep_going():
                    run.report.stopped = True
                    return
                assert checks is not None
                current, checks = checks, run.start_checks(chunks[index + 1]) if index + 1 < len(chunks) else None
                due = run.send_batch(chunk, current.result())
                if due is not None:
                    wake_at = min(wake_at or due, due)
                if run.report.stopped:  # told to stop while this batch waited for the throttle
                    return
                if run.report.fatal:
                    run.report.stopped = True
                    return
            # Written before the next page is read: these slots move out of the state being read.
            due = run.settle()
            if due is not None:
                wake_at = min(wake_at or due, due)
        if wake_at is None:
            run.report.finished = True
            return
        # Something is still open: a retry that is not due yet, or slots another sender holds.
        run.sleep(max(0.0, min(wake_at - clock(), MAX_IDLE_WAIT_MS)) / 1000)


def _open_pages(slots: SlotStore, tenant: str, campaign_id: str) -> Iterator[list[Delivery]]:
    """Yield the open slots (pending, reserved, sending) a page at a time, each state by recipient.

    Read through the state index, so a pass costs the open slots, not every
    slot: the passes that wait for the last retries of a big campaign stay cheap.
    A page is read only when the previous one was handled (slots move meanwhile).
    """
    for state in OPEN_STATES:
        after: str | None = None
        while True:
            page = slots.slot_scan(tenant, campaign_id, after=after, limit=PAGE, state=state)
            if page:
                yield page
            if len(page) < PAGE:
                break
            after = page[-1].recipient


_pools: dict[str, tuple[int, ThreadPoolExecutor]] = {}
_pool_lock = threading.Lock()
READERS = 8
SENDERS = 8  # batches out at once in this process (one per campaign being sent)


def _process_pool(kind: str, workers: int) -> ThreadPoolExecutor:
    """Return this process's pool ``campaign-<kind>`` (made again after a fork)."""
    with _pool_lock:
        made = _pools.get(kind)
        if made is None or made[0] != os.getpid():
            made = _pools[kind] = (os.getpid(), ThreadPoolExecutor(workers, thread_name_prefix=f"campaign-{kind}"))
        return made[1]


def _reads_pool() -> ThreadPoolExecutor:
    """Return this process's pool for the send-time contact reads."""
    return _process_pool("reads", READERS)


def _sends_pool() -> ThreadPoolExecutor:
    """Return this process's pool that runs the broadcasts (so a batch's answers are written meanwhile)."""
    return _process_pool("sends", SENDERS)


@dataclass
class _Answers:
    """A batch's answers sorted for ``SlotStore.slots_record``, and what they ask of the run."""

    sent: list[tuple[Delivery, str, str | None]] = field(default_factory=list)
    failed: list[tuple[Delivery, Failure]] = field(default_factory=list)
    in_doubt: list[tuple[Delivery, str]] = field(default_factory=list)
    blocked: dict[str, str] = field(default_factory=dict)  # address -> evidence
    slow_down_ms: int = 0
    fatal: str | None = None

    @property
    def urgent(self) -> bool:
        """Whether the next batch must see these answers first (a stop, or the provider's delay)."""
        return bool(self.fatal or self.slow_down_ms)


def _earliest(a: int | None, b: int | None) -> int | None:
    """Return the earlier of two optional times (epoch ms); ``None`` when neither is set."""
    return b if a is None else a if b is None else min(a, b)


class _Run:
    def __init__(
        self,
        bot: CampaignBot,
        planner: Planner,
        tenant: str,
        campaign: Campaign,
        slots: SlotStore,
        campaigns: CampaignStore | None,
        options: SendOptions,
        clock: Callable[[], int],
        sleep: Callable[[float], None],
    ) -> None:
        self.bot, self.planner, self.tenant, self.campaign = bot, planner, tenant, campaign
        self.slots, self.campaigns, self.options = slots, campaigns, options
        self.clock, self.sleep = clock, sleep
        self.report = SendReport()
        # The last batch's answers, not written yet, and its in-flight count (a SIGTERM's drain waits for it).
        self._pending: tuple[_Answers, contextlib.ExitStack] | None = None
        self._early_due: int | None = None  # a retry time from answers written before a throttle's wait

    def settle(self) -> int | None:
        """Write the answers of the batch before, if any are pending; return when a retry is due (ms), if any."""
        if self._pending is None:
            return None
        answers, guard = self._pending
        self._pending = None
        with guard:
            return self._commit(answers)

    def abandon(self) -> None:
        """Write the pending answers on the way out of an error; a failure is logged, the first error stays."""
        try:
            self.settle()
        except Exception as exc:  # the slots stay "sending": in doubt later, never resent
            log.warning("campaign %s: a batch's answers were not written: %s", self.campaign.id, type(exc).__name__)

    def start_checks(self, candidates: Sequence[Delivery]) -> Future[list[tuple[str | None, Contact | None]]]:
        """Start reading the candidates' contacts again (``Planner.check_many``: one read for the batch)."""
        recipients = [(d.contact_id, d.recipient) for d in candidates]
        return _reads_pool().submit(self.planner.check_many, self.campaign.channel, recipients)

    def send_batch(
        self,
        candidates: Sequence[Delivery],
        checks: Sequence[tuple[str | None, Contact | None]],
    ) -> int | None:
        """Send one batch (``checks``: its contacts' send-time checks); return when a retry is due (ms), if any."""
        tenant, cid, channel = self.tenant, self.campaign.id, self.campaign.channel
        dropped: list[tuple[Delivery, str]] = []
        ready: dict[str, tuple[Delivery, OutboundMessage]] = {}
        for d, (reason, contact) in zip(candidates, checks, strict=True):
            if reason is None:
                name = contact.name if contact else None
                message = self._message(d, name)
                reason = self._hooks(Recipient(d.contact_id, d.recipient, d.chat_key, name), message)
            if reason is not None:
                dropped.append((d, reason))
            else:
                ready[d.recipient] = (d, message)
        if dropped:
            self._drop(dropped)
        if not ready:
            return None
        self._throttle(len(ready))
        if stopping():  # told to stop during the throttle's wait: this batch does not start
            self.report.stopped = True
            return self._pop_early_due()
        # Reserved and marked sending in one write, right before the requests leave: from here on a
        # sender that dies leaves these slots "sending", and they become in doubt, never resent.
        sending = self.slots.slots_reserve(
            tenant,
            cid,
            [d for d, _ in ready.values()],
            token=new_token(),
            ttl_ms=self.options.ttl_ms,
            now_ms=self.clock(),
            sending=True,
        )
        if not sending:
            return self._pop_early_due()
        by_recipient = {d.recipient: d for d in sending}
        messages = [ready[d.recipient][1] for d in sending]
        with span("campaign.batch", tenant=tenant, campaign_id=cid, channel=channel, size=len(messages)):
            with contextlib.ExitStack() as guard:
                guard.enter_context(inflight(len(messages)))
                out = _sends_pool().submit(contextvars.copy_context().run, self.bot.provider.broadcast, messages)
                try:
                    due = _earliest(self.settle(), self._pop_early_due())  # the batch before, while this one is out
                except BaseException:
                    # That write failed: wait for this batch, keep its answers for ``abandon`` and raise.
                    self._pending = (self._answers(sending, by_recipient, self._results(out, sending)), guard.pop_all())
                    raise
                answers = self._answers(sending, by_recipient, self._results(out, sending))
                if answers.urgent:
                    wake = self._commit(answers)
                    return wake if due is None else min(due, wake or due)
                self._pending = (answers, guard.pop_all())
                return due

    def _pop_early_due(self) -> int | None:
        due, self._early_due = self._early_due, None
        return due

    def _results(self, out: Future[list[SendResult]], sending: list[Delivery]) -> list[SendResult]:
        """Wait for a broadcast's results; if it raised, release the batch's slots and raise ``BroadcastFailed``."""
        try:
            return out.result()
        except Exception as exc:
            tenant, cid = self.tenant, self.campaign.id
            self.slots.slots_release(tenant, cid, sending, now_ms=self.clock())
            log.warning("campaign %s: broadcast raised %s; %d slot(s) released", cid, type(exc).__name__, len(sending))
            raise BroadcastFailed(f"the provider's broadcast raised {type(exc).__name__}") from exc

    def _drop(self, dropped: list[tuple[Delivery, str]]) -> None:
        """Drop (reserve and drop in one write) the slots whose send-time check or hook said no, with reasons."""
        tenant, cid = self.tenant, self.campaign.id
        done = self.slots.slots_drop(tenant, cid, dropped, token=new_token(), now_ms=self.clock())
        self.report.dropped += len(done)
        for d in done:
            self.report.drop_reasons[d.reason or ""] = self.report.drop_reasons.get(d.reason or "", 0) + 1

    def _message(self, d: Delivery, name: str | None) -> OutboundMessage:
        m = self.campaign.message.render(name)
        key = hashlib.sha256(f"{self.tenant}:{self.campaign.id}:{d.recipient}".encode()).hexdigest()[:40]
        template = Template(m.template, m.language, m.parameters) if m.template is not None else None
        # Addressed to the planned address itself; the provider may answer with another canonical id.
        return OutboundMessage(chat_key=d.recipient, text=m.text, template=template, idempotency_key=f"cmp-{key}")

    def _hooks(self, recipient: Recipient, message: OutboundMessage) -> str | None:
        for hook in self.bot.hooks:
            reason = hook(recipient, message)
            if reason:
                return reason if REASON_RE.fullmatch(reason) else "hook"
        return None

    def _throttle(self, count: int) -> None:
        rate = self.options.rate_per_s
        if not rate or self.campaigns is None:
            return
        now = self.clock()
        start = self.campaigns.throttle_take(
            self.tenant, self.options.throttle_key, count=count, interval_ms=1000.0 / rate, now_ms=now
        )
        if start > now:
            # The batch before's answers are written now, not after the wait: its slots' leases
            # (``ttl_ms``) need only outlast one request and this batch's reservation.
            self._early_due = _earliest(self._early_due, self.settle())
            self.sleep((start - now) / 1000)

    def _answers(
        self,
        sending: list[Delivery],
        by_recipient: dict[str, Delivery],
        results: Sequence[SendResult],
    ) -> _Answers:
        """Sort a batch's results by slot (matched by destination chat); a stop is reported at once."""
        cid = self.campaign.id
        answers = _Answers()
        answered: set[str] = set()
        for result in results:
            d = by_recipient.get(result.chat_key)
            if d is None or d.recipient in answered:
                continue  # not one of ours: never guess which slot an answer belongs to
            answered.add(d.recipient)
            if result.outcome is SendOutcome.ACCEPTED and result.provider_message_id:
                answers.sent.append((d, result.provider_message_id, result.recipient))
            elif result.outcome is SendOutcome.NO_ANSWER:
                answers.in_doubt.append((d, "no_answer"))  # a network error: the provider may have the message
            else:
                answers.failed.append(
                    (d, Failure(result.error_code, result.error_title, result.retryable, result.retry_after_ms))
                )
                if result.retry_after_ms:
                    answers.slow_down_ms = max(answers.slow_down_ms, result.retry_after_ms)
                if result.outcome is SendOutcome.BAD_CREDENTIALS:  # every further send fails too: stop
                    answers.fatal = f"the provider refused the channel's credentials (code {result.error_code})"
                    self.report.fatal = answers.fatal
                if result.outcome is SendOutcome.BLOCKED:
                    said = f"{self.campaign.channel.capitalize()} {result.error_code}"  # "Telegram 403"
                    answers.blocked[d.recipient] = f"{said} to campaign {cid}: {result.error_title or 'blocked'}"
        answers.in_doubt += [(d, "no_result") for d in sending if d.recipient not in answered]
        return answers

    def _commit(self, answers: _Answers) -> int | None:
        """Write a batch's answers (one slot write), then its CRM blocks and the provider's delay.

        Return when a retry is due (ms), if any.
        """
        tenant, cid, now = self.tenant, self.campaign.id, self.clock()
        sent, failed, blocked, slow_down = answers.sent, answers.failed, answers.blocked, answers.slow_down_ms
        wake: int | None = None
        # One write for the whole batch's answers (its counters move in the same commit).
        done = self.slots.slots_record(
            tenant,
            cid,
            sent=sent,
            failed=failed,
            in_doubt=answers.in_doubt,
            max_attempts=self.options.max_attempts,
            now_ms=now,
        )
        for d in done:
            if d.state == "accepted":
                self.report.accepted += 1
            elif d.state == "pending":
                self.report.retrying += 1
                wake = min(wake or d.not_before or now, d.not_before or now)
            elif d.state == "failed":
                self.report.failed += 1
            elif d.state == "in_doubt":
                self.report.in_doubt += 1
        if sent:
            metrics.count("messages.out", len(sent))
        if failed:
            metrics.count("messages.out_failed", len(failed))
        for address, evidence in blocked.items():  # after the slots are marked: a CRM failure must not undo them
            _blocked_us(tenant, cid, self.campaign.channel, address, evidence)
        if slow_down and self.campaigns is not None:
            self.campaigns.throttle_take(
                tenant, self.options.throttle_key, count=0, interval_ms=0, now_ms=now, not_before_ms=now + slow_down
            )
        return wake


def _blocked_us(tenant: str, campaign_id: str, channel: str, address: str, evidence: str) -> None:
    """Record in the CRM that the recipient at ``address`` blocked us on ``channel`` (consent ``denied``).

    Best effort, as the inbox's (``inbox.services.replies._blocked_us``): the
    slot is already recorded ``failed``, so a ``DomainError`` (a ``ValidationError``
    of the address, the CRM's store unavailable) is logged (no address) and
    counted in ``errors``, and the run goes on with the other blocks and the throttle.
    """
    from crm.services import contact_blocked_us

    try:
        contact_blocked_us(tenant, channel=channel, identity=address, evidence=evidence, source="campaign")
    except DomainError as exc:
        log.warning("campaign %s: a block on %s was not recorded in the CRM: %s", campaign_id, channel, exc.code)
        metrics.count("errors")
