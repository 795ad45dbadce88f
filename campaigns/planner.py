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

At send time ``check`` looks at the contact again (consent may have been
withdrawn since the plan), and ``consent_denied`` records a block reported by
the provider (Telegram 403) in the CRM.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from botmesh_admin.errors import NotFound
from crm.domain import Contact, SegmentRules, rules_match

from .domain import PlanCounts, Recipient, chat_key_of

SAMPLE = 10


class ContactSource(Protocol):
    """Where the planner reads contacts (the CRM by default; a test may pass its own)."""

    def every(self) -> Iterable[Contact]:
        """Yield every contact of the tenant."""
        ...

    def get(self, contact_id: str) -> Contact | None:
        """Return the contact, or ``None`` if it does not exist."""
        ...


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


@dataclass(frozen=True)
class Plan:
    """The recipients in audience order, the counts, and a few examples of each kind for the preview."""

    recipients: tuple[Recipient, ...]
    counts: PlanCounts
    examples: dict[str, list[str]]


def address_key(channel: str, address: str) -> str:
    """Return what makes two addresses one recipient for the provider (WhatsApp: the digits)."""
    return "".join(ch for ch in address if ch.isdigit()) if channel == "whatsapp" else address


class Planner:
    """Plans campaigns of one tenant over a ``ContactSource`` (the CRM by default)."""

    def __init__(self, tenant: str, contacts: ContactSource | None = None) -> None:
        self.tenant = tenant
        self.contacts = contacts if contacts is not None else CrmContacts(tenant)

    def plan(self, *, rules: SegmentRules, channel: str, contact_ids: Sequence[str] | None = None) -> Plan:
        """Return the recipients of a campaign to the segment ``rules`` on ``channel``."""
        # Consent on the campaign's own channel is checked (and counted) as opted_out, not as a rule.
        match_rules = replace(rules, consent_required=None) if rules.consent_required == channel else rules
        dropped: dict[str, int] = {}
        examples: dict[str, list[str]] = {}
        recipients: list[Recipient] = []
        seen_contacts: set[str] = set()
        seen_addresses: set[str] = set()
        considered = 0

        def drop(reason: str, label: str) -> None:
            dropped[reason] = dropped.get(reason, 0) + 1
            if len(examples.setdefault(reason, [])) < SAMPLE:
                examples[reason].append(label)

        for item in self._audience(contact_ids):
            considered += 1
            contact_id, contact = item
            if contact is None:
                drop("contact_not_found", contact_id)
                continue
            label = contact.name or contact.id
            if contact.id in seen_contacts:
                drop("duplicate", label)
                continue
            seen_contacts.add(contact.id)
            if not rules_match(match_rules, contact):
                drop("not_in_segment", label)
                continue
            addresses = contact.addresses(channel)
            if not addresses:
                drop("no_identity", label)
                continue
            if contact.consent_status(channel) != "granted":
                drop("opted_out", label)
                continue
            key = address_key(channel, addresses[0])
            if key in seen_addresses:
                drop("duplicate", label)
                continue
            seen_addresses.add(key)
            recipients.append(Recipient(contact.id, addresses[0], chat_key_of(channel, addresses[0]), contact.name))
            if len(examples.setdefault("recipients", [])) < SAMPLE:
                examples["recipients"].append(label)
        counts = PlanCounts(considered, len(recipients), dict(sorted(dropped.items())))
        return Plan(tuple(recipients), counts, examples)

    def _audience(self, contact_ids: Sequence[str] | None) -> Iterator[tuple[str, Contact | None]]:
        if contact_ids is None:
            for contact in self.contacts.every():
                yield contact.id, contact
            return
        for contact_id in contact_ids:
            yield contact_id, self.contacts.get(contact_id)

    def check(self, contact_id: str, channel: str, address: str) -> tuple[str | None, Contact | None]:
        """Look at a planned recipient again just before sending: ``(drop reason or None, contact)``."""
        contact = self.contacts.get(contact_id)
        if contact is None:
            return "contact_erased", None
        if address not in contact.addresses(channel):
            return "no_identity", contact
        if contact.consent_status(channel) != "granted":
            return "opted_out", contact
        return None, contact

    def consent_denied(self, contact_id: str, channel: str, *, evidence: str) -> None:
        """Record in the CRM that the contact blocked us on ``channel`` (consent ``denied``)."""
        from crm.services import consent_set

        try:
            consent_set(self.tenant, contact_id, channel=channel, status="denied", source="campaign",
                        evidence=evidence[:500])
        except NotFound:
            pass  # erased meanwhile: nothing left to mark
