"""CRM writes: contacts, identities, consent and erasure.

Every function takes the tenant first, the rest keyword-only, validates its
input (``ValidationError`` names the field path) and only then writes through
the store. Contacts written by several writers at once (the inbox upserting
from inbound messages, an import, an agent) are changed by read → compare-and-set
→ retry, so no concurrent change is lost. Times are epoch milliseconds.

Logs carry contact ids only, never phone numbers, emails or chat ids.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from botmesh_admin.errors import Conflict, NotFound, ValidationError, bounded
from botmesh_admin.kv.cas import cas_retry
from botmesh_admin.validation import validate_text
from crm.domain import (
    CHANNELS,
    MAX_EVIDENCE,
    Consent,
    Contact,
    Identity,
    IdentityTaken,
    new_id,
    normalize_identities,
    normalize_identity,
    normalize_tags,
    now_ms,
    validate_attribute_name,
    validate_attributes,
    validate_consent,
    validate_contact,
    validate_name,
)
from crm.selectors import contact_find_by_identity, tenant_region
from crm.stores import default_store

log = logging.getLogger(__name__)

CONTACT_ATTEMPTS = 200
"""``cas_retry``'s bound for one contact: the inbox, an import and agents may all write it at once.

Above the kernel's ``CONTENDED_ATTEMPTS`` (20, an import row's merge and the
segment definitions' sync): every inbound message of a contact writes it too.
"""
UNSET: Any = object()


def _changing_too_fast(what: str) -> Conflict:
    """The CRM's wording of an exhausted retry (409), as users and import reports have always seen it."""
    return Conflict(f"{what} is changing too fast; try again")


def _version_miss(exc: Conflict) -> bool:
    """True for a contact store's compare-and-set miss (another version was found), not a domain refusal."""
    return not isinstance(exc, IdentityTaken) and exc.current_version is not None


def identity_hash(identity: Identity) -> str:
    """Return the keyed hash (HMAC-SHA256 with ``settings.BOTMESH_HASH_KEY``) of an identity.

    Suppression entries are keyed by it, so the list holds no readable phone or email.
    """
    from django.conf import settings

    key = str(settings.BOTMESH_HASH_KEY).encode()
    return hmac.new(key, identity.key.encode(), hashlib.sha256).hexdigest()


def _source(source: object, field: str = "source") -> str:
    return validate_text(source, field, max_len=100).strip()


def _apply_suppressions(tenant: str, contact: Contact, identities: Iterable[Identity]) -> Contact:
    """Deny consent on channels whose identity was erased with a denied consent (unless decided)."""
    store = default_store()
    for ident in identities:
        if contact.consent_status(ident.channel) != "unknown":
            continue
        record = store.suppression_get(tenant, identity_hash(ident))
        if record is not None:
            contact = contact.with_consent(
                Consent(
                    ident.channel,
                    "denied",
                    now_ms(),
                    "suppression list",
                    "consent was denied before this identity was erased",
                )
            )
    return contact


# --------------------------------------------------------------------------- contacts


def _mutate(
    tenant: str,
    contact_id: str,
    change: Callable[[Contact], Contact | None],
    *,
    release: Callable[[Contact, Contact], tuple[str, ...]] | None = None,
) -> Contact:
    """Apply ``change`` by compare-and-set, re-reading and retrying after a concurrent write.

    ``change`` returns the new contact, or ``None`` when nothing changes.
    """
    store = default_store()

    def attempt() -> Contact:
        current = store.contact_get(tenant, contact_id)
        if current is None:
            raise NotFound(f"contact {bounded(str(contact_id), 60)} not found")
        changed = change(current)
        if changed is None or changed == current:
            return current
        changed = validate_contact(replace(changed, updated_at=now_ms()))
        return store.contact_replace(
            tenant,
            changed,
            expected_version=current.version,
            release_suppressions=release(current, changed) if release else (),
        )

    return cas_retry(
        attempt,
        what=f"contact {contact_id}",
        attempts=CONTACT_ATTEMPTS,
        retry_on=Conflict,
        retry_if=_version_miss,
        exhausted=lambda: _changing_too_fast(f"contact {contact_id}"),
    )


def _new_contact(
    tenant: str,
    *,
    identities: tuple[Identity, ...],
    name: str | None,
    tags: tuple[str, ...] = (),
    attributes: Mapping[str, Any] | None = None,
    source: str,
) -> Contact:
    at = now_ms()
    contact = Contact(
        id=new_id("c"),
        identities=identities,
        name=name,
        tags=tags,
        attributes=dict(attributes or {}),
        source=source,
        created_at=at,
        updated_at=at,
    )
    return _apply_suppressions(tenant, contact, identities)


def contact_upsert_identity(
    tenant: str, *, channel: str, address: str, name: str | None = None, source: str
) -> Contact:
    """Return the contact owning the identity, creating it if there is none.

    ``address`` is normalised first (a digits-only WhatsApp ``wa_id`` is read as
    international). ``name`` fills in the display name of a contact that has
    none; it never overwrites one. Concurrent calls for one new identity create
    exactly one contact. Raise ``ValidationError`` for a bad channel or address.
    """
    source = _source(source)
    identity = Identity(channel, normalize_identity(channel, address, tenant_region(tenant)))
    try:
        name = validate_name(name, "name")
    except ValidationError:
        name = None  # a profile name we cannot store must not lose the message's contact
    store = default_store()

    def attempt() -> Contact:
        found = store.contact_find(tenant, identity)
        if found is not None:
            if name and not found.name:
                return _mutate(tenant, found.id, lambda c: None if c.name else replace(c, name=name))
            return found
        contact = validate_contact(_new_contact(tenant, identities=(identity,), name=name, source=source))
        created = store.contact_insert(tenant, contact)  # IdentityTaken: another writer created it first
        log.info("crm contact created tenant=%s contact=%s source=%s", tenant, created.id, source)
        return created

    return cas_retry(
        attempt,
        what="identity",
        attempts=CONTACT_ATTEMPTS,
        retry_on=IdentityTaken,
        exhausted=lambda: _changing_too_fast("identity"),
    )


def contact_create(
    tenant: str,
    *,
    identities: Iterable[Mapping[str, Any] | Identity],
    name: str | None = None,
    tags: Iterable[str] = (),
    attributes: Mapping[str, Any] | None = None,
    consent: Mapping[str, Mapping[str, Any]] | None = None,
    source: str = "api",
) -> Contact:
    """Create a contact; raise ``IdentityTaken`` (409) if an identity already has an owner.

    ``consent`` maps channel → ``{"status", "evidence"?}``. An identity on the
    suppression list starts with consent denied; a ``granted`` given here does
    not lift that (use ``consent_set`` with the person's new opt-in).
    """
    source = _source(source, "contact.source")
    contact = _new_contact(
        tenant,
        identities=normalize_identities(identities, tenant_region(tenant)),
        name=validate_name(name),
        tags=normalize_tags(tags),
        attributes=validate_attributes(attributes or {}),
        source=source,
    )
    if not contact.identities:
        raise ValidationError("contact.identities", "a contact needs at least one identity")
    for channel, entry in _consent_input(consent, "contact.consent").items():
        if contact.consent_status(channel) == "denied" and entry["status"] == "granted":
            continue
        contact = contact.with_consent(Consent(channel, entry["status"], now_ms(), source, entry.get("evidence")))
    created = default_store().contact_insert(tenant, validate_contact(contact))
    log.info("crm contact created tenant=%s contact=%s source=%s", tenant, created.id, source)
    return created


def _consent_input(consent: object, field: str) -> dict[str, dict[str, Any]]:
    if consent is None:
        return {}
    if not isinstance(consent, Mapping):
        raise ValidationError(field, "must be an object of channel → {status, evidence}")
    out: dict[str, dict[str, Any]] = {}
    for channel, entry in consent.items():
        if isinstance(entry, str):
            entry = {"status": entry}
        if not isinstance(entry, Mapping):
            raise ValidationError(f"{field}.{channel}", "must be an object {status, evidence}")
        validate_consent(channel, entry.get("status"), "input", entry.get("evidence"), f"{field}.{channel}")
        out[channel] = dict(entry)
    return out


def contact_update(
    tenant: str,
    contact_id: str,
    *,
    expected_version: int,
    name: str | None = UNSET,
    identities: Iterable[Mapping[str, Any] | Identity] | None = UNSET,
    tags: Iterable[str] | None = UNSET,
    add_tags: Iterable[str] = (),
    remove_tags: Iterable[str] = (),
    attributes: Mapping[str, Any] | None = None,
    remove_attributes: Iterable[str] = (),
) -> Contact:
    """Change a contact if it is still at ``expected_version`` (compare-and-set).

    ``identities`` and ``tags`` replace the lists; ``add_tags``/``remove_tags``
    edit them; ``attributes`` are merged in (a ``null`` value is stored as
    null) and ``remove_attributes`` deletes names. Raise ``Conflict`` (409, with
    ``current_version``) on a stale version, ``NotFound``, ``IdentityTaken`` or
    ``ValidationError`` — all before anything is written.
    """
    store = default_store()
    current = store.contact_get(tenant, contact_id)
    if current is None:
        raise NotFound(f"contact {bounded(str(contact_id), 60)} not found")
    changes: dict[str, Any] = {}
    if name is not UNSET:
        changes["name"] = validate_name(name)
    new_identities: tuple[Identity, ...] = current.identities
    if identities is not UNSET and identities is not None:
        new_identities = normalize_identities(identities, tenant_region(tenant))
        if not new_identities:
            raise ValidationError("contact.identities", "a contact needs at least one identity")
        changes["identities"] = new_identities
    new_tags = set(current.tags)
    if tags is not UNSET and tags is not None:
        new_tags = set(normalize_tags(tags))
    new_tags |= set(normalize_tags(add_tags, "contact.add_tags"))
    new_tags -= set(normalize_tags(remove_tags, "contact.remove_tags"))
    changes["tags"] = normalize_tags(new_tags)
    attrs = {**current.attributes, **validate_attributes(attributes or {})}
    for i, attr in enumerate(remove_attributes):
        attrs.pop(validate_attribute_name(attr, f"contact.remove_attributes[{i}]"), None)
    changes["attributes"] = validate_attributes(attrs)
    if current.version != expected_version:
        raise Conflict(
            f"contact changed: expected version {expected_version}, found {current.version}",
            current_version=current.version,
        )
    updated = replace(current, **changes, updated_at=now_ms())
    added = [i for i in new_identities if i not in current.identities]
    updated = validate_contact(_apply_suppressions(tenant, updated, added))
    return store.contact_replace(tenant, updated, expected_version=expected_version)


def contact_tags_add(tenant: str, contact_id: str, *, tags: Iterable[str]) -> Contact:
    """Add ``tags`` to a contact (compare-and-set retry: concurrent edits are kept)."""
    wanted = normalize_tags(tags, "tags")
    return _mutate(tenant, contact_id, lambda c: replace(c, tags=normalize_tags({*c.tags, *wanted})))


def contact_tags_remove(tenant: str, contact_id: str, *, tags: Iterable[str]) -> Contact:
    """Remove ``tags`` from a contact (compare-and-set retry)."""
    unwanted = set(normalize_tags(tags, "tags"))
    return _mutate(tenant, contact_id, lambda c: replace(c, tags=tuple(t for t in c.tags if t not in unwanted)))


def consent_set(
    tenant: str, contact_id: str, *, channel: str, status: str, source: str, evidence: str | None = None
) -> Contact:
    """Record marketing consent on ``channel`` (``granted`` / ``denied`` / ``unknown``).

    Read → compare-and-set → retry, so concurrent consent and tag changes are
    all kept. Setting the status it already has writes nothing. ``granted``
    is a new opt-in: it also lifts the channel's suppression entries. Return the
    contact; raise ``NotFound`` or ``ValidationError`` (``consent.status``…).
    """
    validate_consent(channel, status, source, evidence)
    source = source.strip()

    def change(contact: Contact) -> Contact | None:
        if contact.consent_status(channel) == status:
            return None
        return contact.with_consent(Consent(channel, status, now_ms(), source, evidence))

    def release(before: Contact, after: Contact) -> tuple[str, ...]:
        if status != "granted":
            return ()
        return tuple(identity_hash(i) for i in after.identities if i.channel == channel)

    contact = _mutate(tenant, contact_id, change, release=release)
    log.info("crm consent tenant=%s contact=%s channel=%s status=%s", tenant, contact_id, channel, status)
    return contact


def contact_blocked_us(
    tenant: str, *, channel: str, identity: str, evidence: str, source: str | None = None
) -> Contact | None:
    """Record that the user behind ``identity`` blocked us on ``channel``: its consent there is ``denied``.

    The one place this is recorded, whoever learned it: a campaign send or an
    agent's reply answered by the provider's block (``channels`` outcome
    ``blocked``: Telegram 403 "bot was blocked by the user"). ``identity`` is
    the address on ``channel`` (a Telegram user id, a WhatsApp number in any
    format; normalised as every identity is); ``evidence`` is what the provider
    said (cut to ``MAX_EVIDENCE`` characters, with ``…``); ``source`` names who
    learned it (default: ``channel``). Return the contact holding the identity,
    or ``None`` when no contact has it (never created, or erased meanwhile:
    nothing is left to mark). Raise ``ValidationError`` for an unknown channel
    or a malformed identity (``identity``).
    """
    if not isinstance(identity, str) or not identity.strip():
        raise ValidationError("identity", "must be the address on the channel")
    if channel not in CHANNELS:
        raise ValidationError("channel", f"must be one of {', '.join(CHANNELS)}")
    if not isinstance(evidence, str) or not evidence.strip():
        raise ValidationError("evidence", "must say what the provider answered")
    try:
        contact = contact_find_by_identity(tenant, channel=channel, address=identity)
    except ValidationError as exc:
        raise ValidationError("identity", exc.problem) from exc
    if contact is None:
        return None
    text = evidence if len(evidence) <= MAX_EVIDENCE else evidence[: MAX_EVIDENCE - 1] + "…"
    try:
        return consent_set(
            tenant, contact.id, channel=channel, status="denied", source=source or channel, evidence=text
        )
    except NotFound:
        return None  # erased between the lookup and the write


@dataclass(frozen=True)
class ErasureReport:
    """What ``contact_erase`` removed (counts and channel names: no personal data)."""

    contact_id: str
    identities: int
    channels: tuple[str, ...]
    tags: int
    attributes: int
    consent_records: int
    suppressed_channels: tuple[str, ...]
    conversations: int = 0
    """The inbox conversations linked to the contact, erased with it (their messages, notes, markers)."""


ERASE_CONVERSATIONS_PAGE = 50


def _erase_conversations(tenant: str, contact_id: str) -> int:
    """Erase every inbox conversation linked to ``contact_id`` (``inbox.services.conversation_erase``).

    Reads the first page of the ``conv_contact`` index again after each page (an erased one leaves
    it) until it holds none not tried yet; return how many were erased.
    """
    from inbox.selectors import conversation_list
    from inbox.services.conversations import conversation_erase

    erased, tried = 0, set()
    while True:
        rows, _ = conversation_list(tenant, agent="system", contact_id=contact_id, limit=ERASE_CONVERSATIONS_PAGE)
        fresh = [row.conversation.id for row in rows if row.conversation.id not in tried]
        if not fresh:
            return erased
        for conversation_id in fresh:
            tried.add(conversation_id)
            try:
                conversation_erase(tenant, conversation_id)
            except NotFound:
                continue  # erased meanwhile (another erasure, a concurrent request)
            erased += 1


def contact_erase(tenant: str, contact_id: str, *, conversations: bool = True) -> ErasureReport:
    """Erase a contact: the record, its identities, tags, attributes and consent history, and its conversations.

    Right to erasure: the inbox conversations linked to it (their messages, notes
    and read markers: the person's name, number and words) go first, so an
    erasure cut short is finished by erasing again while the contact still
    exists. A ``denied`` consent survives as suppression entries keyed by the
    keyed hash of each identity on that channel (``identity_hash``), so
    re-importing the same phone does not revive marketing consent. Raise
    ``NotFound``. (A chat that writes again later starts a new conversation and
    contact.) ``conversations=False`` keeps them, linked to a contact that no
    longer exists: the state an erasure of an earlier release left.
    """
    store = default_store()
    if store.contact_get(tenant, contact_id) is None:
        raise NotFound(f"contact {bounded(str(contact_id), 60)} not found")
    erased_conversations = _erase_conversations(tenant, contact_id) if conversations else 0

    def attempt() -> tuple[Contact, dict[str, dict[str, Any]]]:
        contact = store.contact_get(tenant, contact_id)
        if contact is None:
            raise NotFound(f"contact {bounded(str(contact_id), 60)} not found")
        suppressions: dict[str, dict[str, Any]] = {}
        for ident in contact.identities:
            consent = contact.consent.get(ident.channel)
            if consent is not None and consent.status == "denied":
                suppressions[identity_hash(ident)] = {
                    "channel": ident.channel,
                    "status": "denied",
                    "at": consent.at,
                    "erased_at": now_ms(),
                }
        store.contact_delete(tenant, contact_id, expected_version=contact.version, suppressions=suppressions)
        return contact, suppressions

    contact, suppressions = cas_retry(
        attempt,
        what=f"contact {contact_id}",
        attempts=CONTACT_ATTEMPTS,
        retry_on=Conflict,
        retry_if=lambda exc: exc.current_version is not None,
        exhausted=lambda: _changing_too_fast(f"contact {contact_id}"),
    )
    log.info("crm contact erased tenant=%s contact=%s", tenant, contact_id)
    return ErasureReport(
        contact_id=contact_id,
        identities=len(contact.identities),
        channels=tuple(dict.fromkeys(i.channel for i in contact.identities)),
        tags=len(contact.tags),
        attributes=len(contact.attributes),
        consent_records=len(contact.consent_history),
        suppressed_channels=tuple(dict.fromkeys(r["channel"] for r in suppressions.values())),
        conversations=erased_conversations,
    )


erase = contact_erase
