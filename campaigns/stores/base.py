"""The contracts of the campaign stores (enforced by ``tests/campaigns/test_store_contract.py``).

Stores persist what the services validated; they know nothing of HTTP, Celery
or settings. Every method is tenant-scoped: another tenant's campaign is absent.

``CampaignStore`` keeps the campaigns (compare-and-set on ``version``), the
cross-tenant index of active campaigns the scheduler reads, and the per-channel
send throttle. ``SlotStore`` keeps one send slot (``Delivery``) per (tenant,
campaign, recipient) and applies the slot rules of ``campaigns.domain``:

- ``slots_reserve`` takes available slots (pending and due, or an expired
  reservation without a provider id) for ``ttl_ms`` under one new token;
- ``slots_mark_sending`` records that their requests are leaving;
- ``slots_mark_sent`` records the provider id and counts the send;
- ``slots_mark_failed`` records the refusal and, when retryable, releases the
  slot (due again after the delay) until ``max_attempts``;
- ``slots_mark_in_doubt`` / ``slots_mark_dropped`` / ``slots_release`` /
  ``slots_cancel`` / ``slot_resend`` as their names say;
- ``slots_record`` records a batch's answers (acceptances, refusals, no
  answers) in one write, and ``slots_drop`` drops available slots before any
  request leaves (reserve and drop in one write): a sender's batch costs
  two slot writes (reserve, record) whatever its outcomes, each one Kv commit
  in the Kv store (progress counters included: ``Add`` in that commit).

``slots_claim`` is how a plan fixes its recipients: the first contact to claim
a recipient key gets the key and its slot, so the planner dedupes exactly
without holding the recipients in memory. ``slot_counts`` is what the progress
shows (O(1) in the Kv store: counters kept in each slot commit) and
``slot_scan`` with a filter reads O(page) there (value indexes).

Each batch method takes slots as the store returned them (their ``version``
and ``token`` say what the caller holds), applies its changes atomically per
slot and returns the slots it changed, in the given order; a slot that is no longer held by the
caller's token (or not in a state the rule accepts) is left alone and left
out of the result — it is never an error. Times are epoch milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol, runtime_checkable

from botmesh_admin.errors import Conflict, NotFound
from botmesh_admin.pagination import validate_limit
from campaigns import domain
from campaigns.domain import Campaign, Delivery, DeliveryCounts, Failure, StateConflict

MAX_SCAN = 5000


class VersionConflict(Conflict):
    """A compare-and-set on a campaign's version missed: it changed since it was read (HTTP 409).

    ``current_version`` is the version found. Services retry on it (``cas_retry(retry_on=VersionConflict)``);
    a state refusal (``StateConflict``) is another class and is never retried.
    """


def validate_scan_limit(limit: int, field: str = "limit") -> int:
    """Return ``limit`` if ``1 <= limit <= MAX_SCAN``, else raise ``ValidationError`` naming ``field``."""
    return validate_limit(limit, field=field, maximum=MAX_SCAN)


Change = Callable[[Delivery], Delivery | None]


def slot_matches(d: Delivery, *, state: str | None, reason: str | None, contact_id: str | None) -> bool:
    """Return True if ``d`` matches every filter given (``None``: any)."""
    return (
        (state is None or d.state == state)
        and (reason is None or d.reason == reason)
        and (contact_id is None or d.contact_id == contact_id)
    )


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """An active campaign as the scheduler sees it: ``at`` is when it is due (ms) or ``None``."""

    tenant: str
    campaign_id: str
    state: str
    at: int | None = None


@runtime_checkable
class CampaignStore(Protocol):
    """Campaign records, the active-campaign index and the per-channel throttle."""

    def campaign_get(self, tenant: str, campaign_id: str) -> Campaign | None:
        """Return the campaign, or ``None`` if it does not exist in ``tenant``."""
        ...

    def campaign_insert(self, tenant: str, campaign: Campaign) -> Campaign:
        """Store a new campaign; return it at version 1. Raise ``Conflict`` if the id exists."""
        ...

    def campaign_replace(self, tenant: str, campaign: Campaign, *, expected_version: int) -> Campaign:
        """Replace the campaign if it is at ``expected_version``; return it at the next version.

        Raise ``NotFound`` if it is absent and ``Conflict`` (with ``current_version``) if stale.
        """
        ...

    def campaign_delete(self, tenant: str, campaign_id: str, *, expected_version: int) -> None:
        """Delete the campaign at ``expected_version``; raise ``NotFound`` / ``Conflict``."""
        ...

    def campaign_scan(
        self,
        tenant: str,
        *,
        after: str | None = None,
        limit: int = 100,
        state: str | None = None,
    ) -> list[Campaign]:
        """Return up to ``limit`` (1..5000) campaigns ordered by id, after the id ``after``.

        Only campaigns in ``state`` if it is given.
        """
        ...

    def campaign_scan_by_segment(
        self, tenant: str, segment_id: str, *, states: Sequence[str], limit: int = 10
    ) -> list[Campaign]:
        """Return up to ``limit`` (1..5000) campaigns to ``segment_id`` in one of ``states``, by state then id.

        O(limit) in the Kv store (the ``campaign_segment`` value index): what
        deleting a segment asks (``crm.services.segment_delete``).
        """
        ...

    def index_put(self, tenant: str, campaign_id: str, *, state: str, at: int | None) -> None:
        """Record (or update) an active campaign in the scheduler's index."""
        ...

    def index_delete(self, tenant: str, campaign_id: str) -> None:
        """Remove a campaign from the index (no error if absent)."""
        ...

    def index_scan(self, *, after: tuple[str, str] | None = None, limit: int = 500) -> list[IndexEntry]:
        """Return index entries of every tenant ordered by (tenant, campaign id), after ``after``."""
        ...

    def throttle_take(
        self, tenant: str, key: str, *, count: int, interval_ms: float, now_ms: int, not_before_ms: int | None = None
    ) -> int:
        """Book ``count`` sends on the throttle ``key``, ``interval_ms`` apart; return when they may start (ms).

        The booking is shared by every process using the store: the next caller
        starts after ``count * interval_ms``. ``not_before_ms`` pushes the
        throttle back (a provider asked to slow down).
        """
        ...


@runtime_checkable
class SlotStore(Protocol):
    """Send slots, one per (tenant, campaign, recipient)."""

    def slots_add(self, tenant: str, campaign_id: str, deliveries: Sequence[Delivery]) -> int:
        """Add pending slots; a recipient that has a slot already keeps it. Return how many were added."""
        ...

    def slots_claim(self, tenant: str, campaign_id: str, claims: Sequence[tuple[str, Delivery]]) -> list[bool]:
        """Give each ``(recipient key, pending slot)`` its slot unless another contact has the key; return who has it.

        ``claims`` come in audience order. The first contact to claim a key
        gets it and its slot is added; a contact claiming a key it already has
        (a plan run again after a crash) keeps its slot as it is. Return, per
        claim, True if the claim's contact has the key (a recipient), False if
        another contact has it (a duplicate recipient). A slot added without a
        claim (``slots_add``) gives the key to the slot's contact.
        """
        ...

    def slot_get(self, tenant: str, campaign_id: str, recipient: str) -> Delivery | None:
        """Return the slot of ``recipient``, or ``None``."""
        ...

    def slot_scan(
        self,
        tenant: str,
        campaign_id: str,
        *,
        after: str | None = None,
        limit: int = 100,
        state: str | None = None,
        reason: str | None = None,
        contact_id: str | None = None,
    ) -> list[Delivery]:
        """Return up to ``limit`` (1..5000) slots ordered by recipient, after the recipient ``after``.

        ``state``, ``reason`` and ``contact_id`` keep only the slots matching
        every one given (the Kv store reads them through an index: O(page)).
        """
        ...

    def slot_counts(self, tenant: str, campaign_id: str) -> DeliveryCounts:
        """Return the slots counted per state and per ``state:reason`` (``count_deliveries``' definition)."""
        ...

    def slots_reserve(
        self,
        tenant: str,
        campaign_id: str,
        candidates: Sequence[Delivery | str],
        *,
        token: str,
        ttl_ms: int,
        now_ms: int,
        sending: bool = False,
    ) -> list[Delivery]:
        """Reserve every available candidate for ``ttl_ms`` under ``token``; return the reserved slots.

        Pending slots that are due and reservations that expired without a
        provider id are available; ``sending``, ``in_doubt`` and final slots
        never are. With ``sending`` the slots are reserved and marked
        ``sending`` in the same write (the caller's requests leave next).
        """
        ...

    def slots_mark_sending(
        self, tenant: str, campaign_id: str, held: Sequence[Delivery], *, ttl_ms: int, now_ms: int
    ) -> list[Delivery]:
        """Mark held slots ``sending`` (their requests are about to leave) for ``ttl_ms``."""
        ...

    def slots_mark_sent(
        self, tenant: str, campaign_id: str, sent: Sequence[tuple[Delivery, str, str | None]], *, now_ms: int
    ) -> list[Delivery]:
        """Record acceptances ``(slot, provider message id, provider's recipient id)``; count each send."""
        ...

    def slots_mark_failed(
        self,
        tenant: str,
        campaign_id: str,
        failed: Sequence[tuple[Delivery, Failure]],
        *,
        max_attempts: int,
        now_ms: int,
    ) -> list[Delivery]:
        """Record refusals; release retryable ones (due after the delay) until ``max_attempts``."""
        ...

    def slots_mark_dropped(
        self, tenant: str, campaign_id: str, dropped: Sequence[tuple[Delivery, str]], *, now_ms: int
    ) -> list[Delivery]:
        """Drop held slots before their request leaves, each with its reason."""
        ...

    def slots_mark_in_doubt(
        self,
        tenant: str,
        campaign_id: str,
        items: Sequence[tuple[Delivery, str]],
        *,
        now_ms: int,
        expired_only: bool = False,
    ) -> list[Delivery]:
        """Mark ``sending`` slots in doubt with a reason: the holder's own, or (``expired_only``) any expired one."""
        ...

    def slots_record(
        self,
        tenant: str,
        campaign_id: str,
        *,
        sent: Sequence[tuple[Delivery, str, str | None]] = (),
        failed: Sequence[tuple[Delivery, Failure]] = (),
        in_doubt: Sequence[tuple[Delivery, str]] = (),
        max_attempts: int,
        now_ms: int,
    ) -> list[Delivery]:
        """Record one batch's answers in one write: ``sent`` as ``slots_mark_sent``, ``failed`` as
        ``slots_mark_failed``, ``in_doubt`` as ``slots_mark_in_doubt`` (the holder's own); return the
        changed slots (sent, then failed, then in doubt, each in the given order). A slot may be in one list only.
        """
        ...

    def slots_drop(
        self, tenant: str, campaign_id: str, dropped: Sequence[tuple[Delivery, str]], *, token: str, now_ms: int
    ) -> list[Delivery]:
        """Drop available slots before their request leaves, each with its reason (``slots_reserve`` under
        ``token`` then ``slots_mark_dropped``, in one write); a slot another sender holds is left alone."""
        ...

    def slots_release(self, tenant: str, campaign_id: str, held: Sequence[Delivery], *, now_ms: int) -> list[Delivery]:
        """Give held slots back to ``pending`` unchanged (no attempt is counted)."""
        ...

    def slots_cancel(self, tenant: str, campaign_id: str, *, now_ms: int) -> int:
        """Cancel every slot nobody holds (pending or expired reservation); return how many."""
        ...

    def slot_resend(self, tenant: str, campaign_id: str, recipient: str, *, now_ms: int) -> Delivery:
        """Put an ``in_doubt`` slot back to pending; raise ``NotFound`` or ``StateConflict``."""
        ...

    def slots_drop_all(self, tenant: str, campaign_id: str) -> None:
        """Delete every slot of the campaign."""
        ...


class SlotRules:
    """The named slot methods, written once over ``_apply`` (each store supplies the atomic part)."""

    def _apply(self, tenant: str, campaign_id: str, items: Sequence[tuple[Delivery | str, Change]]) -> list[Delivery]:
        """Apply each change to the current slot by compare-and-set; return the changed slots in order."""
        raise NotImplementedError

    def slots_reserve(
        self,
        tenant: str,
        campaign_id: str,
        candidates: Sequence[Delivery | str],
        *,
        token: str,
        ttl_ms: int,
        now_ms: int,
        sending: bool = False,
    ) -> list[Delivery]:
        change = partial(domain.reserve, token=token, ttl_ms=ttl_ms, now=now_ms, sending=sending)
        return self._apply(tenant, campaign_id, [(c, change) for c in candidates])

    def slots_mark_sending(
        self, tenant: str, campaign_id: str, held: Sequence[Delivery], *, ttl_ms: int, now_ms: int
    ) -> list[Delivery]:
        return self._apply(
            tenant,
            campaign_id,
            [(d, partial(domain.mark_sending, token=d.token or "", ttl_ms=ttl_ms, now=now_ms)) for d in held],
        )

    def slots_mark_sent(
        self, tenant: str, campaign_id: str, sent: Sequence[tuple[Delivery, str, str | None]], *, now_ms: int
    ) -> list[Delivery]:
        return self._apply(
            tenant,
            campaign_id,
            [
                (
                    d,
                    partial(
                        domain.mark_sent,
                        token=d.token or "",
                        provider_message_id=pid,
                        provider_recipient=rcpt,
                        now=now_ms,
                    ),
                )
                for d, pid, rcpt in sent
            ],
        )

    def slots_mark_failed(
        self,
        tenant: str,
        campaign_id: str,
        failed: Sequence[tuple[Delivery, Failure]],
        *,
        max_attempts: int,
        now_ms: int,
    ) -> list[Delivery]:
        return self._apply(
            tenant,
            campaign_id,
            [
                (
                    d,
                    partial(
                        domain.mark_failed, token=d.token or "", failure=failure, max_attempts=max_attempts, now=now_ms
                    ),
                )
                for d, failure in failed
            ],
        )

    def slots_mark_dropped(
        self, tenant: str, campaign_id: str, dropped: Sequence[tuple[Delivery, str]], *, now_ms: int
    ) -> list[Delivery]:
        return self._apply(
            tenant,
            campaign_id,
            [
                (d, partial(domain.mark_dropped, token=d.token or "", reason=reason, now=now_ms))
                for d, reason in dropped
            ],
        )

    def slots_mark_in_doubt(
        self,
        tenant: str,
        campaign_id: str,
        items: Sequence[tuple[Delivery, str]],
        *,
        now_ms: int,
        expired_only: bool = False,
    ) -> list[Delivery]:
        return self._apply(
            tenant,
            campaign_id,
            [
                (
                    d,
                    partial(
                        domain.mark_in_doubt, reason=reason, now=now_ms, token=None if expired_only else d.token or ""
                    ),
                )
                for d, reason in items
            ],
        )

    def slots_record(
        self,
        tenant: str,
        campaign_id: str,
        *,
        sent: Sequence[tuple[Delivery, str, str | None]] = (),
        failed: Sequence[tuple[Delivery, Failure]] = (),
        in_doubt: Sequence[tuple[Delivery, str]] = (),
        max_attempts: int,
        now_ms: int,
    ) -> list[Delivery]:
        items: list[tuple[Delivery | str, Change]] = []
        for d, pid, rcpt in sent:
            change = partial(
                domain.mark_sent, token=d.token or "", provider_message_id=pid, provider_recipient=rcpt, now=now_ms
            )
            items.append((d, change))
        for d, failure in failed:
            change = partial(
                domain.mark_failed, token=d.token or "", failure=failure, max_attempts=max_attempts, now=now_ms
            )
            items.append((d, change))
        for d, reason in in_doubt:
            items.append((d, partial(domain.mark_in_doubt, reason=reason, now=now_ms, token=d.token or "")))
        recipients = [d.recipient for d, _, _ in sent] + [d.recipient for d, _ in (*failed, *in_doubt)]
        if len(set(recipients)) != len(recipients):
            raise ValueError("slots_record: a slot is in more than one list")
        return self._apply(tenant, campaign_id, items)

    def slots_drop(
        self, tenant: str, campaign_id: str, dropped: Sequence[tuple[Delivery, str]], *, token: str, now_ms: int
    ) -> list[Delivery]:
        return self._apply(
            tenant,
            campaign_id,
            [(d, partial(domain.drop_available, token=token, reason=reason, now=now_ms)) for d, reason in dropped],
        )

    def slots_release(self, tenant: str, campaign_id: str, held: Sequence[Delivery], *, now_ms: int) -> list[Delivery]:
        return self._apply(
            tenant, campaign_id, [(d, partial(domain.release, token=d.token or "", now=now_ms)) for d in held]
        )

    def slots_cancel(self, tenant: str, campaign_id: str, *, now_ms: int) -> int:
        cancelled = 0
        for state in ("pending", "reserved"):  # only these can be cancelled: O(open slots), not O(slots)
            after = None
            while True:
                page = self.slot_scan(  # type: ignore[attr-defined]
                    tenant, campaign_id, after=after, limit=1000, state=state
                )
                todo = [d for d in page if domain.cancel(d, now=now_ms) is not None]
                if todo:
                    cancelled += len(
                        self._apply(tenant, campaign_id, [(d, partial(domain.cancel, now=now_ms)) for d in todo])
                    )
                if len(page) < 1000:
                    break
                after = page[-1].recipient
        return cancelled

    def slot_resend(self, tenant: str, campaign_id: str, recipient: str, *, now_ms: int) -> Delivery:
        current = self.slot_get(tenant, campaign_id, recipient)  # type: ignore[attr-defined]
        if current is None:
            raise NotFound("delivery not found")
        done = self._apply(tenant, campaign_id, [(current, partial(domain.resend, now=now_ms))])
        if not done:
            raise StateConflict("only a delivery in doubt can be resent", current_version=current.version)
        return done[0]
