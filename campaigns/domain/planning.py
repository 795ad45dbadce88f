"""The planner: from a segment and a channel, who gets a campaign — and why the others do not.

``Planner(tenant).plan(rules=…, channel=…)`` walks the audience (every contact
of the tenant, or a listed set of contact ids) and keeps each contact that
matches the segment, has an identity on the channel and has granted marketing
consent there, once per recipient address. Everyone else is counted under one
reason, checked in this order:

``contact_not_found``  a listed id that is not (or no longer) a contact
``duplicate``          a contact listed twice, or a second contact with the same address
``not_in_segment``     the contact does not match the segment's rules
``no_identity``        no identity on the campaign's channel
``opted_out``          marketing consent on the channel is not ``granted`` (denied or unknown)

The plan streams: the audience is read and judged ``BATCH`` contacts at a
time and duplicate recipients are found by a ``Claims`` — ``SeenKeys`` for a
preview (a set that moves to a temporary SQLite file past ``SPILL_KEYS`` keys),
the campaign's slot store for a run (a plan record per recipient key, written
with the slot) — so planning 1,000,000 recipients holds no more than a batch
in memory, and the dedupe stays exact.

At send time ``check`` looks at the contact again (consent may have been
withdrawn since the plan); ``check_many`` does it for a sender's batch with
one read (``ContactSource.get_many`` when the source has it: the CRM's
``contact_get_many``, one Kv ``get_many``).

Pure: it reads contacts through a ``ContactSource`` (the CRM's selectors by
default) and records nothing but through the ``Claims`` it is given, so the
preview (``campaigns.selectors``) and a run (``campaigns.services.planning``,
whose claims are the slot store's) share it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Protocol

from botmesh_admin.errors import NotFound
from crm.domain import Contact, SegmentRules, rules_match

from . import ConversationCheck, PlanCounts, Recipient, chat_key_of

SAMPLE = 10
BATCH = 500
SPILL_KEYS = 50_000


class ContactSource(Protocol):
    """Where the planner reads contacts (the CRM by default; a test may pass its own)."""

    def every(self) -> Iterable[Contact]:
        """Yield every contact of the tenant, once each, by ascending id (the CRM's scan order)."""
        ...

    def get(self, contact_id: str) -> Contact | None:
        """Return the contact, or ``None`` if it does not exist."""
        ...


def _get_many(source: ContactSource, contact_ids: Sequence[str]) -> dict[str, Contact]:
    """Return the contacts of ``contact_ids`` that exist, by id: one read if the source has ``get_many``."""
    many = getattr(source, "get_many", None)
    if many is not None:
        return dict(many(contact_ids))
    found = ((i, source.get(i)) for i in dict.fromkeys(contact_ids))
    return {i: c for i, c in found if c is not None}


class CrmContacts:
    """The tenant's contacts through the CRM selectors."""

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant

    def every(self) -> Iterator[Contact]:
        from crm.selectors import contact_iter

        return contact_iter(self.tenant)

    def get(self, contact_id: str) -> Contact | None:
        from crm.selectors import contact_get

        try:
            return contact_get(self.tenant, contact_id)
        except NotFound:
            return None

    def get_many(self, contact_ids: Sequence[str]) -> dict[str, Contact]:
        """Return the contacts of ``contact_ids`` that exist, by id (one Kv ``get_many`` per 1,000 ids)."""
        from crm.selectors import contact_get_many

        return contact_get_many(self.tenant, contact_ids)


@dataclass(frozen=True)
class Plan:
    """The counts, a few examples of each kind for the preview, and the first recipients in audience order.

    ``recipients`` holds every recipient unless the plan was asked to keep
    fewer (``Planner.plan(keep=…)``); ``counts.recipients`` always counts them all.
    ``no_conversation`` is the preview's look at the sending channel
    (``campaigns.selectors.campaign_plan`` with a ``channel_name``), else ``None``.
    """

    recipients: tuple[Recipient, ...]
    counts: PlanCounts
    examples: dict[str, list[str]]
    no_conversation: ConversationCheck | None = None


class Claims(Protocol):
    """Who has each recipient key: the planner's exact dedupe of recipients."""

    def claim(self, items: Sequence[tuple[str, Recipient]]) -> list[bool]:
        """Return, per ``(recipient key, recipient)`` in audience order, True if that contact has the key.

        The first contact to claim a key has it; a later claim by another
        contact is False (a duplicate recipient).
        """
        ...


class SeenKeys:
    """In-process ``Claims`` for one plan: exact, and bounded in memory.

    Keys are kept in a set until there are more than ``spill``; then they move
    to a private temporary SQLite database (on disk, deleted on ``close``)
    whose page cache is the only memory they take from then on.
    """

    def __init__(self, spill: int = SPILL_KEYS) -> None:
        self.spill = spill
        self._keys: set[str] = set()
        self._db: sqlite3.Connection | None = None

    def claim(self, items: Sequence[tuple[str, Recipient]]) -> list[bool]:
        if self._db is None and len(self._keys) + len(items) > self.spill:
            self._move_to_disk()
        if self._db is None:
            granted = []
            for key, _ in items:
                granted.append(key not in self._keys)
                self._keys.add(key)
            return granted
        cursor = self._db.cursor()
        granted = []
        for key, _ in items:
            cursor.execute("INSERT OR IGNORE INTO seen (key) VALUES (?)", (key,))
            granted.append(cursor.rowcount == 1)
        return granted

    def _move_to_disk(self) -> None:
        # "" names a private temporary database: on disk once it outgrows its cache, removed on close.
        self._db = sqlite3.connect("", isolation_level=None)
        self._db.execute("PRAGMA cache_size = -4096")  # KiB: the page cache, all the memory it takes
        self._db.execute("PRAGMA journal_mode = OFF")
        self._db.execute("PRAGMA synchronous = OFF")
        self._db.execute("CREATE TABLE seen (key TEXT PRIMARY KEY) WITHOUT ROWID")
        self._db.execute("BEGIN")
        self._db.executemany("INSERT INTO seen (key) VALUES (?)", ((k,) for k in self._keys))
        self._keys = set()

    def close(self) -> None:
        """Drop the keys (and the temporary database)."""
        if self._db is not None:
            self._db.close()
            self._db = None
        self._keys = set()

    def __enter__(self) -> SeenKeys:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def address_key(channel: str, address: str) -> str:
    """Return what makes two addresses one recipient for the provider (WhatsApp: the digits)."""
    return "".join(ch for ch in address if ch.isdigit()) if channel == "whatsapp" else address


@dataclass
class _Tally:
    """The plan's counts and examples as the audience is judged, in audience order."""

    keep: int | None
    considered: int = 0
    count: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)
    recipients: list[Recipient] = field(default_factory=list)

    def drop(self, reason: str, label: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1
        if len(self.examples.setdefault(reason, [])) < SAMPLE:
            self.examples[reason].append(label)

    def take(self, recipient: Recipient, label: str) -> None:
        self.count += 1
        if self.keep is None or len(self.recipients) < self.keep:
            self.recipients.append(recipient)
        if len(self.examples.setdefault("recipients", [])) < SAMPLE:
            self.examples["recipients"].append(label)


# A judged contact: its label, the reason it is left out (or None), and its claim (key, recipient) if any.
_Verdict = tuple[str, str | None, tuple[str, Recipient] | None]


class Planner:
    """Plans campaigns of one tenant over a ``ContactSource`` (the CRM by default)."""

    def __init__(self, tenant: str, contacts: ContactSource | None = None) -> None:
        self.tenant = tenant
        self.contacts = contacts if contacts is not None else CrmContacts(tenant)

    def plan(
        self,
        *,
        rules: SegmentRules,
        channel: str,
        contact_ids: Sequence[str] | None = None,
        claims: Claims | None = None,
        keep: int | None = None,
    ) -> Plan:
        """Return the recipients of a campaign to the segment ``rules`` on ``channel``.

        The audience is streamed ``BATCH`` contacts at a time; ``claims`` finds
        the duplicate recipients (default: a ``SeenKeys`` of this call) and,
        for a run, records the recipients (the slot store's). ``keep`` bounds
        how many recipients the returned plan holds (``None``: all; a run
        passes 0 and a preview a small number, so memory stays bounded).
        Raise ``ValueError`` if the source's contacts do not come by ascending id.
        """
        # Consent on the campaign's own channel is checked (and counted) as opted_out, not as a rule.
        match_rules = replace(rules, consent_required=None) if rules.consent_required == channel else rules
        tally = _Tally(keep)
        with SeenKeys() as own:
            batch: list[_Verdict] = []
            for verdict in self._judge(
                self._audience(contact_ids), match_rules, channel, listed=contact_ids is not None
            ):
                batch.append(verdict)
                if len(batch) == BATCH:
                    self._settle(batch, claims or own, tally)
                    batch = []
            self._settle(batch, claims or own, tally)
        counts = PlanCounts(tally.considered, tally.count, dict(sorted(tally.dropped.items())))
        return Plan(tuple(tally.recipients), counts, tally.examples)

    def _judge(
        self,
        audience: Iterator[tuple[str, Contact | None]],
        rules: SegmentRules,
        channel: str,
        *,
        listed: bool,
    ) -> Iterator[_Verdict]:
        """Yield each contact's verdict but the address dedupe (``Claims`` settles that per batch)."""
        seen_listed: set[str] = set()  # a listed audience is in memory already (at most MAX_CONTACT_IDS)
        last_id: str | None = None
        for contact_id, contact in audience:
            if contact is None:
                yield contact_id, "contact_not_found", None
                continue
            label = contact.name or contact.id
            if listed:
                repeated = contact.id in seen_listed
                seen_listed.add(contact.id)
            else:
                # Every contact by ascending id: a repeat can only be the one just seen.
                if last_id is not None and contact.id < last_id:
                    raise ValueError(f"the contact source yielded {contact.id} after {last_id}")
                repeated, last_id = contact.id == last_id, contact.id
            if repeated:
                yield label, "duplicate", None
                continue
            if not rules_match(rules, contact):
                yield label, "not_in_segment", None
                continue
            addresses = contact.addresses(channel)
            if not addresses:
                yield label, "no_identity", None
                continue
            if contact.consent_status(channel) != "granted":
                yield label, "opted_out", None
                continue
            recipient = Recipient(contact.id, addresses[0], chat_key_of(channel, addresses[0]), contact.name)
            yield label, None, (address_key(channel, addresses[0]), recipient)

    def _settle(self, batch: Sequence[_Verdict], claims: Claims, tally: _Tally) -> None:
        """Claim the batch's recipient keys, then count every verdict in audience order."""
        wanted = [claim for _, _, claim in batch if claim is not None]
        granted = iter(claims.claim(wanted) if wanted else [])
        for label, reason, claim in batch:
            tally.considered += 1
            if claim is None:
                tally.drop(reason or "", label)
            elif next(granted):
                tally.take(claim[1], label)
            else:
                tally.drop("duplicate", label)

    def _audience(self, contact_ids: Sequence[str] | None) -> Iterator[tuple[str, Contact | None]]:
        if contact_ids is None:
            for contact in self.contacts.every():
                yield contact.id, contact
            return
        for contact_id in contact_ids:
            yield contact_id, self.contacts.get(contact_id)

    def check(self, contact_id: str, channel: str, address: str) -> tuple[str | None, Contact | None]:
        """Look at a planned recipient again just before sending: ``(drop reason or None, contact)``."""
        return _verdict(self.contacts.get(contact_id), channel, address)

    def check_many(
        self, channel: str, recipients: Sequence[tuple[str, str]]
    ) -> list[tuple[str | None, Contact | None]]:
        """``check`` each ``(contact id, address)`` of a sender's batch, reading the contacts in one go.

        Return the verdicts in the given order (``contact_erased``, ``no_identity``,
        ``opted_out`` or ``None``, with the contact as read).
        """
        found = _get_many(self.contacts, [contact_id for contact_id, _ in recipients])
        return [_verdict(found.get(contact_id), channel, address) for contact_id, address in recipients]


def _verdict(contact: Contact | None, channel: str, address: str) -> tuple[str | None, Contact | None]:
    """The send-time verdict on a planned recipient's contact as read now (``Planner.check``)."""
    if contact is None:
        return "contact_erased", None
    if address not in contact.addresses(channel):
        return "no_identity", contact
    if contact.consent_status(channel) != "granted":
        return "opted_out", contact
    return None, contact
