"""CRM value types and their validation (ARCHITECTURE §5, crm).

A ``Contact`` has channel identities (``whatsapp`` E.164, ``telegram`` numeric
user id, ``email``), a display name, tags, attributes (string, number, boolean
or null), marketing consent per channel with its history, a ``version`` and
created/updated times in epoch **milliseconds**. A ``Segment`` is a saved set of
rules evaluated against contacts.

Everything a store persists is built here first: ``contact_from_input`` and
``segment_rules_from_input`` raise ``ValidationError`` naming the field path
(``contact.identities[1].address: not a phone number``), so a bad write never
reaches a store.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeAlias

import phonenumbers

from botmesh_admin.errors import BadType, Conflict, NotFound, ValidationError
from botmesh_admin.ids import new_id as new_id
from botmesh_admin.kv.validation import now_ms as now_ms
from botmesh_admin.validation import validate_text

CHANNELS = ("whatsapp", "telegram", "email")
CONSENT_STATUSES = ("granted", "denied", "unknown")
ATTRIBUTE_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
TAG_RE = re.compile(r"^[^\W_][\w .:/-]{0,63}$")
EMAIL_RE = re.compile(
    r"^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}@"
    r"(?=.{4,253}$)(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,63}$"
)
PHONE_CHARS_RE = re.compile(r"^\+?[0-9 ().\-/]{4,40}$")
MAX_NAME = 200
MAX_TAGS = 100
MAX_ATTRIBUTES = 100
MAX_IDENTITIES = 20
MAX_ATTRIBUTE_TEXT = 1000
MAX_SOURCE = 100
MAX_EVIDENCE = 500
MAX_CONSENT_HISTORY = 50
MAX_TELEGRAM_ID = 2**53  # Bot API: user ids fit a 53-bit integer

AttributeValue: TypeAlias = str | int | float | bool | None


# --------------------------------------------------------------------------- identities


def _without_mexican_mobile_one(number: phonenumbers.PhoneNumber) -> phonenumbers.PhoneNumber:
    """Return ``+52 1 55 1234 5678`` as ``+52 55 1234 5678``.

    Mexico dropped the "1" of mobile numbers in August 2019 (IFT's numbering
    plan) and ``phonenumbers`` no longer accepts it, but WhatsApp ``wa_id``s of
    Mexican mobiles still carry it.
    """
    national = str(number.national_number)
    if number.country_code == 52 and len(national) == 11 and national.startswith("1"):
        return phonenumbers.PhoneNumber(country_code=52, national_number=int(national[1:]))
    return number


def _with_brazilian_mobile_nine(number: phonenumbers.PhoneNumber) -> phonenumbers.PhoneNumber:
    """Return ``+55 11 8123-4567`` as ``+55 11 98123-4567``.

    Brazil put a ninth digit, a leading 9, in front of every mobile number
    (Anatel Resolução nº 553 of 14 December 2010; area code 11 from July 2012,
    the last areas on 6 November 2016). ``phonenumbers`` no longer accepts the
    8-digit form, but WhatsApp ``wa_id``s of accounts made before the change
    still lack the 9, while the number the person writes in a form has it: both
    are one contact. Only a number that is not valid as it stands and becomes a
    valid *mobile* with the 9 is changed (8-digit landlines start with 2-5 and
    stay as they are).
    """
    national = str(number.national_number)
    if number.country_code != 55 or len(national) != 10 or national[2] not in "6789":
        return number
    if phonenumbers.is_valid_number(number):
        return number
    nine = phonenumbers.PhoneNumber(country_code=55, national_number=int(national[:2] + "9" + national[2:]))
    mobile = phonenumbers.number_type(nine) == phonenumbers.PhoneNumberType.MOBILE
    return nine if mobile and phonenumbers.is_valid_number(nine) else number


def _normalize_phone(address: str, default_region: str, field: str) -> str:
    text = address.strip()
    if not PHONE_CHARS_RE.fullmatch(text):
        raise ValidationError(field, "not a phone number")
    digits = re.sub(r"\D", "", text)
    candidates: list[phonenumbers.PhoneNumber] = []
    try:
        if text.isdigit():
            # WhatsApp wa_id (``573001112233``) is international without "+".
            candidates.append(phonenumbers.parse("+" + digits, None))
        candidates.append(phonenumbers.parse(text, default_region))
    except phonenumbers.NumberParseException:
        pass
    candidates = [_with_brazilian_mobile_nine(_without_mexican_mobile_one(n)) for n in candidates]
    for check in (phonenumbers.is_valid_number, phonenumbers.is_possible_number):
        for number in candidates:
            if check(number):
                return phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)
    raise ValidationError(field, "not an E.164 phone number (and not a number of the default region)")


def normalize_identity(channel: str, address: str, default_region: str = "CO", *, field: str = "address") -> str:
    """Return ``address`` in the canonical form of ``channel``; raise ``ValidationError``.

    - ``whatsapp``: E.164 (``+573001112233``) parsed with the ``phonenumbers``
      library; a number without ``+`` is read in ``default_region`` (ISO 3166),
      and a digits-only address (a WhatsApp ``wa_id``) is read as international;
      the forms older WhatsApp ids keep are folded into the current number
      (Mexico's ``+52 1``, Brazil's mobiles without their ninth digit).
    - ``telegram``: the numeric user id as decimal digits (``"700001004"``).
    - ``email``: trimmed and lower-cased.

    ``field`` names the value in the error (``contact.identities[0].address``).
    """
    if not isinstance(channel, str) or channel not in CHANNELS:
        raise ValidationError(_sibling(field, "channel"), f"must be one of {', '.join(CHANNELS)}")
    if isinstance(address, bool) or not isinstance(address, (str, int)):
        raise BadType(field, f"must be a string, not {type(address).__name__}")
    text = str(address).strip()
    if not text:
        raise ValidationError(field, "must not be empty")
    if channel == "whatsapp":
        return _normalize_phone(text, default_region or "CO", field)
    if channel == "telegram":
        # The length first: Python refuses to read an integer of over 4,300 digits (a ValueError).
        if not text.isascii() or not text.isdigit() or len(text) > 20 or not 0 < int(text) < MAX_TELEGRAM_ID:
            raise ValidationError(field, "not a Telegram user id (a positive integer)")
        return str(int(text))
    if len(text) > 254 or not EMAIL_RE.fullmatch(text):
        raise ValidationError(field, "not an email address")
    return text.lower()


def _sibling(field: str, name: str) -> str:
    head, dot, _ = field.rpartition(".")
    return f"{head}.{name}" if dot else name


@dataclass(frozen=True, slots=True)
class Identity:
    """One channel identity; ``address`` is normalised (see ``normalize_identity``)."""

    channel: str
    address: str

    @property
    def key(self) -> str:
        """Return ``"<channel>:<address>"``, the identity's unique key inside a tenant."""
        return f"{self.channel}:{self.address}"


# --------------------------------------------------------------------------- consent


@dataclass(frozen=True, slots=True)
class Consent:
    """Marketing consent on one channel: status, when (epoch ms), who/what set it, and why."""

    channel: str
    status: str
    at: int
    source: str
    evidence: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the stored JSON form."""
        return {"channel": self.channel, "status": self.status, "at": self.at, "source": self.source,
                "evidence": self.evidence}  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Consent:
        """Return the ``Consent`` stored as ``data``."""
        return cls(data["channel"], data["status"], int(data["at"]), data["source"], data.get("evidence"))


def validate_consent(channel: object, status: object, source: object, evidence: object, field: str = "consent") -> None:
    """Raise ``ValidationError`` unless the consent fields are valid."""
    if channel not in CHANNELS:
        raise ValidationError(f"{field}.channel", f"must be one of {', '.join(CHANNELS)}")
    if status not in CONSENT_STATUSES:
        raise ValidationError(f"{field}.status", f"must be one of {', '.join(CONSENT_STATUSES)}")
    validate_text(source, f"{field}.source", max_len=MAX_SOURCE)
    if evidence is not None:
        validate_text(evidence, f"{field}.evidence", max_len=MAX_EVIDENCE, blank=True)


# --------------------------------------------------------------------------- contact


@dataclass(frozen=True, slots=True)
class Contact:
    """A person known to the tenant. Times are epoch milliseconds.

    ``consent`` maps channel → current ``Consent`` (a channel without an entry is
    ``unknown``); ``consent_history`` holds the last changes, oldest first.
    """

    id: str
    identities: tuple[Identity, ...] = ()
    name: str | None = None
    tags: tuple[str, ...] = ()
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)
    consent: Mapping[str, Consent] = field(default_factory=dict)
    consent_history: tuple[Consent, ...] = ()
    source: str | None = None
    version: int = 0
    created_at: int = 0
    updated_at: int = 0

    def consent_status(self, channel: str) -> str:
        """Return ``granted``, ``denied`` or ``unknown`` for ``channel``."""
        entry = self.consent.get(channel)
        return entry.status if entry else "unknown"

    def addresses(self, channel: str) -> list[str]:
        """Return the contact's addresses on ``channel``."""
        return [i.address for i in self.identities if i.channel == channel]

    def with_consent(self, consent: Consent) -> Contact:
        """Return a copy with ``consent`` current for its channel and appended to the history."""
        history = (*self.consent_history, consent)[-MAX_CONSENT_HISTORY:]
        return replace(self, consent={**self.consent, consent.channel: consent}, consent_history=history)

    def to_json(self) -> dict[str, Any]:
        """Return the stored JSON form (without ``version``: the store owns it)."""
        return {
            "id": self.id,
            "identities": [[i.channel, i.address] for i in self.identities],
            "name": self.name,
            "tags": list(self.tags),
            "attributes": dict(self.attributes),
            "consent": {ch: c.to_json() for ch, c in self.consent.items()},
            "consent_history": [c.to_json() for c in self.consent_history],
            "source": self.source,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], version: int = 0) -> Contact:
        """Return the ``Contact`` stored as ``data`` at ``version``."""
        # Every list page decodes each row with this: a current consent is usually also the
        # history's last entry for its channel, so equal records share one ``Consent``.
        history = [Consent.from_json(c) for c in data.get("consent_history", ())]
        last = {c.channel: (stored, c) for stored, c in zip(data.get("consent_history", ()), history, strict=True)}
        consent = {}
        for ch, stored in data.get("consent", {}).items():
            seen = last.get(ch)
            consent[ch] = seen[1] if seen is not None and seen[0] == stored else Consent.from_json(stored)
        return cls(
            data["id"],
            tuple([Identity(ch, addr) for ch, addr in data["identities"]]),
            data.get("name"),
            tuple(data.get("tags", ())),
            dict(data.get("attributes", {})),
            consent,
            tuple(history),
            data.get("source"),
            version,
            int(data.get("created_at", 0)),
            int(data.get("updated_at", 0)),
        )


def validate_name(name: object, field: str = "contact.name") -> str | None:
    """Return the trimmed display name (``None`` if empty); raise ``ValidationError``."""
    if name is None:
        return None
    text = validate_text(name, field, max_len=MAX_NAME, blank=True).strip()
    return text or None


def normalize_tag(tag: object, field: str) -> str:
    """Return ``tag`` trimmed and lower-cased; 1-64 letters, digits, spaces or ``_ - . : /``."""
    if not isinstance(tag, str):
        raise BadType(field, f"must be a string, not {type(tag).__name__}")
    text = " ".join(tag.split()).lower()
    if not TAG_RE.fullmatch(text):
        raise ValidationError(
            field, "must be 1-64 letters, digits, spaces or _ - . : /, starting with a letter or digit"
        )
    return text


def normalize_tags(tags: object, field: str = "contact.tags") -> tuple[str, ...]:
    """Return the tags sorted and without duplicates; raise ``ValidationError``."""
    if isinstance(tags, (str, bytes)) or not isinstance(tags, Iterable):
        raise BadType(field, "must be a list of strings")
    out = sorted({normalize_tag(t, f"{field}[{i}]") for i, t in enumerate(tags)})
    if len(out) > MAX_TAGS:
        raise ValidationError(field, f"more than {MAX_TAGS} tags")
    return tuple(out)


def validate_attribute_name(name: object, field: str) -> str:
    """Return ``name`` if it matches ``^[a-z][a-z0-9_]{0,63}$``."""
    if not isinstance(name, str) or not ATTRIBUTE_NAME_RE.fullmatch(name):
        raise ValidationError(field, "attribute names match ^[a-z][a-z0-9_]{0,63}$")
    return name


def validate_attribute_value(value: object, field: str) -> AttributeValue:
    """Return ``value`` if it is a string (≤1000 chars), finite number, boolean or null."""
    if value is None or isinstance(value, (bool, int)):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**53:
            raise ValidationError(field, "integer outside ±2**53")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValidationError(field, "must be a finite number")
        return value
    if isinstance(value, str):
        return validate_text(value, field, max_len=MAX_ATTRIBUTE_TEXT, blank=True)
    raise BadType(field, f"must be a string, number, boolean or null, not {type(value).__name__}")


def validate_attributes(attributes: object, field: str = "contact.attributes") -> dict[str, AttributeValue]:
    """Return a validated copy of ``attributes``; raise ``ValidationError`` naming the entry."""
    if not isinstance(attributes, Mapping):
        raise BadType(field, "must be an object")
    out: dict[str, AttributeValue] = {}
    for name, value in attributes.items():
        validate_attribute_name(name, f"{field}.{name}")
        out[name] = validate_attribute_value(value, f"{field}.{name}")
    if len(out) > MAX_ATTRIBUTES:
        raise ValidationError(field, f"more than {MAX_ATTRIBUTES} attributes")
    return dict(sorted(out.items()))


def normalize_identities(
    identities: object, default_region: str, field: str = "contact.identities"
) -> tuple[Identity, ...]:
    """Return the identities normalised, without duplicates, in the given order.

    Each is an ``Identity`` or an object of exactly ``channel`` and ``address``; raise
    ``ValidationError`` naming the first bad part (``contact.identities[0].verified``).
    """
    if isinstance(identities, (str, bytes)) or not isinstance(identities, Iterable):
        raise BadType(field, "must be a list of {channel, address}")
    out: list[Identity] = []
    for i, item in enumerate(identities):
        path = f"{field}[{i}]"
        channel: Any
        address: Any
        if isinstance(item, Identity):
            channel, address = item.channel, item.address
        elif isinstance(item, Mapping):
            channel, address = item.get("channel"), item.get("address")
            extra = next((k for k in item if k not in ("channel", "address")), None)
            if extra is not None:  # a typo or a field identities do not have is never dropped silently
                raise ValidationError(f"{path}.{extra}", "is not a field of an identity: only channel and address")
        else:
            raise BadType(path, "must be an object with channel and address")
        if not isinstance(channel, str):
            raise ValidationError(f"{path}.channel", f"must be one of {', '.join(CHANNELS)}")
        ident = Identity(channel, normalize_identity(channel, address, default_region, field=f"{path}.address"))
        if ident not in out:
            out.append(ident)
    if len(out) > MAX_IDENTITIES:
        raise ValidationError(field, f"more than {MAX_IDENTITIES} identities")
    return tuple(out)


def validate_contact(contact: Contact) -> Contact:
    """Check a fully built contact again before it reaches a store (defence in depth)."""
    if not isinstance(contact.id, str) or not re.fullmatch(r"c_[0-9a-f]{22}", contact.id):
        raise ValidationError("contact.id", "not a contact id")
    validate_name(contact.name)
    for i, ident in enumerate(contact.identities):
        if normalize_identity(ident.channel, ident.address, field=f"contact.identities[{i}].address") != ident.address:
            raise ValidationError(f"contact.identities[{i}].address", "not normalised")
    if normalize_tags(contact.tags) != tuple(contact.tags):
        raise ValidationError("contact.tags", "not normalised")
    validate_attributes(contact.attributes)
    for channel, consent in contact.consent.items():
        validate_consent(channel, consent.status, consent.source, consent.evidence, f"contact.consent.{channel}")
    return contact


# --------------------------------------------------------------------------- JSON shapes


# --------------------------------------------------------------------------- segments


@dataclass(frozen=True, slots=True)
class SegmentRules:
    """Who belongs to a segment. Every given rule must hold (AND).

    - ``tags_all``: the contact has every one of these tags;
    - ``tags_any``: the contact has at least one (ignored when empty);
    - ``tags_none``: the contact has none of these tags;
    - ``attributes``: each attribute is present and equal *strictly*: same JSON
      type and value, so ``"1"`` ≠ ``1`` and ``true`` ≠ ``1`` (ints and floats
      are both JSON numbers, so ``1`` = ``1.0``);
    - ``consent_required``: the contact has an identity on that channel and
      its marketing consent there is ``granted``.
    """

    tags_all: tuple[str, ...] = ()
    tags_any: tuple[str, ...] = ()
    tags_none: tuple[str, ...] = ()
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)
    consent_required: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "tags_all": list(self.tags_all),
            "tags_any": list(self.tags_any),
            "tags_none": list(self.tags_none),
            "attributes": dict(self.attributes),
            "consent_required": self.consent_required,
        }


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return type(value).__name__


def strict_equal(a: object, b: object) -> bool:
    """Return True if ``a`` and ``b`` are the same JSON type and value (``"1"`` ≠ ``1`` ≠ ``true``)."""
    return _kind(a) == _kind(b) and a == b


def rules_match_json(rules: SegmentRules, data: Mapping[str, Any]) -> bool:
    """Return True if the stored contact JSON ``data`` satisfies ``rules`` (fast path for scans)."""
    tags = data.get("tags") or ()
    if rules.tags_all and not all(t in tags for t in rules.tags_all):
        return False
    if rules.tags_any and not any(t in tags for t in rules.tags_any):
        return False
    if rules.tags_none and any(t in tags for t in rules.tags_none):
        return False
    if rules.attributes:
        attrs = data.get("attributes") or {}
        for name, want in rules.attributes.items():
            if name not in attrs or not strict_equal(attrs[name], want):
                return False
    if rules.consent_required:
        channel = rules.consent_required
        consent = (data.get("consent") or {}).get(channel)
        if not consent or consent.get("status") != "granted":
            return False
        if not any(ch == channel for ch, _ in data.get("identities") or ()):
            return False
    return True


def rules_match(rules: SegmentRules, contact: Contact) -> bool:
    """Return True if ``contact`` satisfies ``rules`` (the same test as ``rules_match_json``)."""
    tags = contact.tags
    if rules.tags_all and not all(t in tags for t in rules.tags_all):
        return False
    if rules.tags_any and not any(t in tags for t in rules.tags_any):
        return False
    if rules.tags_none and any(t in tags for t in rules.tags_none):
        return False
    attrs = contact.attributes
    for name, want in rules.attributes.items():
        if name not in attrs or not strict_equal(attrs[name], want):
            return False
    if rules.consent_required:
        channel = rules.consent_required
        if contact.consent_status(channel) != "granted":
            return False
        if not any(i.channel == channel for i in contact.identities):
            return False
    return True


def segment_rules_from_input(data: object, field: str = "segment.rules") -> SegmentRules:
    """Return validated ``SegmentRules`` from a JSON object; unknown rule names are refused."""
    if isinstance(data, SegmentRules):
        data = data.to_json()
    if not isinstance(data, Mapping):
        raise BadType(field, "must be an object")
    known = {"tags_all", "tags_any", "tags_none", "attributes", "consent_required"}
    for name in data:
        if name not in known:
            raise ValidationError(f"{field}.{name}", f"unknown rule; use {', '.join(sorted(known))}")
    consent = data.get("consent_required")
    if consent is not None and consent not in CHANNELS:
        raise ValidationError(f"{field}.consent_required", f"must be one of {', '.join(CHANNELS)} or null")
    return SegmentRules(
        tags_all=normalize_tags(data.get("tags_all") or (), f"{field}.tags_all"),
        tags_any=normalize_tags(data.get("tags_any") or (), f"{field}.tags_any"),
        tags_none=normalize_tags(data.get("tags_none") or (), f"{field}.tags_none"),
        attributes=validate_attributes(data.get("attributes") or {}, f"{field}.attributes"),
        consent_required=consent,
    )


@dataclass(frozen=True, slots=True)
class Segment:
    """A saved, named set of rules. Times are epoch milliseconds."""

    id: str
    name: str
    rules: SegmentRules
    version: int = 0
    created_at: int = 0
    updated_at: int = 0

    def to_json(self) -> dict[str, Any]:
        """Return the stored JSON form (without ``version``)."""
        return {
            "id": self.id,
            "name": self.name,
            "rules": self.rules.to_json(),
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], version: int = 0) -> Segment:
        """Return the ``Segment`` stored as ``data`` at ``version``."""
        r = data["rules"]
        rules = SegmentRules(
            tuple(r.get("tags_all", ())),
            tuple(r.get("tags_any", ())),
            tuple(r.get("tags_none", ())),
            dict(r.get("attributes", {})),
            r.get("consent_required"),
        )
        return cls(data["id"], data["name"], rules, version, int(data["created_at"]), int(data["updated_at"]))


def validate_segment_name(name: object, field: str = "segment.name") -> str:
    """Return the trimmed segment name (1-200 characters)."""
    return validate_text(name, field, max_len=MAX_NAME).strip()


# --------------------------------------------------------------------------- segment membership

PLAN_CHANNELS = ("whatsapp", "telegram")
"""The channels a campaign sends on (``campaigns.domain.CHANNELS``; a test keeps the two equal)."""
PLAN_VERDICTS = ("no_identity", "opted_out", "ok")
"""What the campaign planner decides for a contact in a segment's audience, in its order of checks."""
MEMBER: tuple[str, ...] = ("member",)
Group: TypeAlias = tuple[str, ...]
"""A group of a segment's materialized membership: ``MEMBER`` (the contact matches the rules) or
``("plan", channel, verdict)`` (what a campaign on that channel would decide for it)."""


def segment_rules_key(rules: SegmentRules) -> str:
    """Return a short digest of ``rules`` (16 hex digits): membership is kept per segment and rules key.

    Renaming a segment keeps its key (its membership stays valid); changing a rule changes it.
    """
    import json

    raw = json.dumps(rules.to_json(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def plan_group(channel: str, verdict: str) -> Group:
    """Return the membership group of the contacts a campaign on ``channel`` judges ``verdict``."""
    return ("plan", channel, verdict)


def plan_verdict(rules: SegmentRules, data: Mapping[str, Any], channel: str) -> str | None:
    """Return what a campaign to ``rules`` on ``channel`` decides for the contact JSON ``data``.

    ``None`` (not in the segment), else one of ``PLAN_VERDICTS``, in the order of
    ``campaigns.domain.planning.Planner._judge``: the rules without a ``consent_required``
    on the campaign's own channel (that one is judged as ``opted_out``), an
    identity on the channel, consent granted there.
    """
    relaxed = replace(rules, consent_required=None) if rules.consent_required == channel else rules
    if not rules_match_json(relaxed, data):
        return None
    if not any(ch == channel for ch, _ in data.get("identities") or ()):
        return "no_identity"
    if ((data.get("consent") or {}).get(channel) or {}).get("status") != "granted":
        return "opted_out"
    return "ok"


def membership_groups(rules: SegmentRules, data: Mapping[str, Any]) -> list[Group]:
    """Return the membership groups of the stored contact JSON ``data`` for ``rules``.

    ``MEMBER`` when it matches; then, per campaign channel, the planner's
    verdict when it is not ``ok`` (``plan_verdict``). The recipients need no
    group of their own: they are the members less those two groups' members
    (a ``consent_required`` on the campaign's channel makes every member a
    recipient and puts the others in those groups).
    """
    out: list[Group] = [MEMBER] if rules_match_json(rules, data) else []
    for channel in PLAN_CHANNELS:
        verdict = plan_verdict(rules, data, channel)
        if verdict is not None and verdict != "ok":
            out.append(plan_group(channel, verdict))
    return out


# --------------------------------------------------------------------------- index terms and search

Term: TypeAlias = tuple[str | int | bool | None, ...]
"""A posting list of contacts: ``("t", tag)``, ``("c", channel, granted|denied)``, ``("r", channel)``,
``("a", name, kind, attribute_key(value))``; ``ALL`` is every contact (it has a count, no list)."""

ALL: Term = ("all",)
MAX_SEARCH_KEY = 40  # characters of a search key that the index keeps (longer words match on the record)
_SHORT_TEXT_BYTES = 120  # attribute strings up to this many UTF-8 bytes are index keys as they are
_KEY_UNSAFE_RE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")  # what a Kv key may not hold
_WORD_RE = re.compile(r"[^\W_]+")
_PHONE_QUERY_RE = re.compile(r"[0-9\s().+/-]*[0-9][0-9\s().+/-]*")


def tag_term(tag: str) -> Term:
    """Return the term of the contacts that have (normalised) ``tag``."""
    return ("t", tag)


def consent_term(channel: str, status: str) -> Term:
    """Return the term of the contacts whose consent on ``channel`` is ``granted`` or ``denied``.

    ``unknown`` has no posting list: a contact is unknown on a channel when it
    is under neither of the other two (most contacts are, and the inbox creates
    them: three entries and counters fewer per new contact).
    """
    if status not in ("granted", "denied"):
        raise ValueError(f"consent {status!r} has no posting list")
    return ("c", channel, status)


def reachable_term(channel: str) -> Term:
    """Return the term of a segment's ``consent_required``: granted on ``channel`` and an identity there."""
    return ("r", channel)


def attribute_key(value: AttributeValue) -> str | int | bool | None:
    """Return the typed index key of an attribute value: equal keys exactly when ``strict_equal``.

    ``null``, booleans and integers are their own keys (the key encoding keeps
    the three apart, so ``1`` ≠ ``true``); an integral float is the integer (JSON
    has one number type: ``1.0`` = ``1``); other floats are ``"f"`` + ``repr``;
    strings are ``"s"`` + the text, or ``"h"`` + its SHA-256 when it is longer
    than 120 UTF-8 bytes or holds a character no Kv key may hold (a tab).
    """
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 10**19:
            return int(value)
        return "f" + repr(value)
    text = str(value)
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) > _SHORT_TEXT_BYTES or _KEY_UNSAFE_RE.search(text):
        return "h" + hashlib.sha256(raw).hexdigest()
    return "s" + text


def attribute_term(name: str, value: AttributeValue) -> Term:
    """Return the term of the contacts whose attribute ``name`` strictly equals ``value``.

    The key's kind is part of the term: Python counts ``True == 1`` and
    ``False == 0``, so without it two terms could be one dictionary key.
    """
    key = attribute_key(value)
    kind = "z" if key is None else "b" if isinstance(key, bool) else "i" if isinstance(key, int) else "s"
    return ("a", name, kind, key)


def contact_terms(data: Mapping[str, Any]) -> list[Term]:
    """Return every term the stored contact JSON ``data`` is listed under (see ``Term``).

    A channel whose consent is ``granted`` or ``denied`` gives that consent
    term; ``unknown`` (never set, or set to unknown) gives none.
    """
    terms: list[Term] = [tag_term(t) for t in data.get("tags") or ()]
    consent = data.get("consent") or {}
    channels = {ch for ch, _ in data.get("identities") or ()}
    for channel in CHANNELS:
        status = (consent.get(channel) or {}).get("status")
        if status in ("granted", "denied"):
            terms.append(consent_term(channel, status))
        if status == "granted" and channel in channels:
            terms.append(reachable_term(channel))
    for name, value in (data.get("attributes") or {}).items():
        terms.append(attribute_term(name, value))
    return terms


def fold(text: str) -> str:
    """Return ``text`` case-folded and without accents (``"García"`` → ``"garcia"``)."""
    if text.isascii():
        return text.lower()  # ASCII has no accents, and its case folding is lower()
    return _fold_unicode(text)


@functools.lru_cache(maxsize=8192)
def _fold_unicode(text: str) -> str:
    # Cached: a list page folds the names of every contact it looks at, and names repeat.
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def words(text: str) -> list[str]:
    """Return the folded words of ``text`` (letters and digits; anything else separates)."""
    return _WORD_RE.findall(fold(text))


def _phone_keys(address: str) -> tuple[str, ...]:
    """Return the digit strings a person types for an E.164 number: international and national.

    The national significant number is the E.164 digits after the country
    code (ITU-T E.164: country codes are prefix-free, 1-3 digits), found in
    ``phonenumbers``' table without parsing the number.
    """
    digits = address.lstrip("+")
    if not (digits.isascii() and digits.isdigit()):
        return (digits,) if digits else ()  # no phone number (a webhook sender that is not a wa_id): no country code
    for size in (1, 2, 3):
        if int(digits[:size] or 0) in phonenumbers.COUNTRY_CODE_TO_REGION_CODE:
            national = digits[size:]
            return (digits, national) if national else (digits,)
    return (digits,)


def search_keys(name: str | None, identities: Iterable[tuple[str, str]]) -> set[str]:
    """Return the full search keys of a contact; a search term matches a key it starts.

    The keys: the folded words of the name; each email address and its words
    (``ana``, ``example``, ``com``); each WhatsApp number's digits in
    international form and without the country code (``573001112233``,
    ``3001112233``); each
    Telegram user id.
    """
    keys = set(words(name or ""))
    for channel, address in identities:
        if channel == "email":
            keys.add(address)
            keys.update(words(address))
        elif channel == "whatsapp":
            keys.update(_phone_keys(address))
        else:
            keys.add(address)
    return keys


def search_index_keys(name: str | None, identities: Iterable[tuple[str, str]]) -> set[str]:
    """Return the search keys as the index holds them (cut to ``MAX_SEARCH_KEY`` characters)."""
    return {k[:MAX_SEARCH_KEY] for k in search_keys(name, identities)}


def search_terms(query: str) -> list[str]:
    """Return the terms of a text search; a contact matches when every term starts one of its keys.

    A query of digits and phone punctuation (``+57 300-111``) is one digits term;
    otherwise each space-separated part containing ``@`` is an email prefix and
    every other part gives its folded words. An empty list matches nothing.
    """
    text = query.strip()
    if _PHONE_QUERY_RE.fullmatch(text):
        return ["".join(ch for ch in text if ch.isascii() and ch.isdigit())]
    terms: list[str] = []
    for part in fold(text).split():
        terms.extend([part] if "@" in part else words(part))
    return list(dict.fromkeys(terms))


def search_match(terms: Iterable[str], keys: Iterable[str]) -> bool:
    """Return True if every search term starts at least one of ``keys``."""
    keys = list(keys)
    return all(any(k.startswith(t) for k in keys) for t in terms)


# --------------------------------------------------------------------------- import jobs


@dataclass(frozen=True, slots=True)
class ImportJob:
    """A CSV import and its report. ``status``: queued → running → done (or failed).

    It runs as the journal event ``crm.import`` (``crm.services.imports``): a
    ``failed`` job runs again when that event is replayed from the dead-letter queue.

    ``errors`` lists ``{"row", "field", "message"}`` where ``row`` is the row as a
    spreadsheet numbers it (the header is row 1, the first contact row 2);
    ``merges`` lists ``{"row", "contact_id", "name"}`` for each row merged into
    a contact that existed (found by one of the row's identities).
    """

    id: str
    status: str
    filename: str
    total_rows: int = 0
    processed: int = 0
    created: int = 0
    merged: int = 0
    failed_rows: int = 0
    errors: tuple[Mapping[str, Any], ...] = ()
    notices: tuple[Mapping[str, Any], ...] = ()
    merges: tuple[Mapping[str, Any], ...] = ()
    message: str | None = None
    created_by: str = ""
    event_id: str | None = None  # the journal event (``crm.import``) of the run that last started it
    version: int = 0
    created_at: int = 0
    updated_at: int = 0

    @property
    def finished(self) -> bool:
        return self.status in ("done", "failed")

    @property
    def percent(self) -> int:
        if self.finished:
            return 100
        return int(100 * self.processed / self.total_rows) if self.total_rows else 0

    def to_json(self) -> dict[str, Any]:
        """Return the stored JSON form (without ``version``)."""
        data = {name: getattr(self, name) for name in IMPORT_FIELDS}
        data["errors"] = [dict(e) for e in self.errors]
        data["notices"] = [dict(n) for n in self.notices]
        data["merges"] = [dict(m) for m in self.merges]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any], version: int = 0) -> ImportJob:
        """Return the ``ImportJob`` stored as ``data`` at ``version`` (absent fields keep their defaults)."""
        values = {name: data.get(name) for name in IMPORT_FIELDS}
        return cls(
            **{k: v for k, v in values.items() if v is not None},
            errors=tuple(data.get("errors", ())),
            notices=tuple(data.get("notices", ())),
            merges=tuple(data.get("merges", ())),  # absent in jobs from before the merge report
            version=version,
        )


IMPORT_FIELDS = (
    "id",
    "status",
    "filename",
    "total_rows",
    "processed",
    "created",
    "merged",
    "failed_rows",
    "message",
    "created_by",
    "event_id",
    "created_at",
    "updated_at",
)


class IdentityTaken(Conflict):
    """An identity already belongs to another contact of the tenant. HTTP 409.

    ``identity`` is ``"<channel>:<address>"``; ``contact_id`` is its owner.
    """

    code = "identity_taken"

    def __init__(self, identity: str, contact_id: str | None) -> None:
        channel = identity.partition(":")[0]
        super().__init__(
            f"this {channel} identity already belongs to contact {contact_id}",
            contact_id=contact_id,
            field="identities",
        )
        self.identity = identity
        self.contact_id = contact_id


def version_mismatch(kind: str, current: int | None, expected: int) -> NotFound | Conflict:
    """Return the error for a write that expected ``expected`` but found ``current``.

    ``NotFound`` when the record is gone (``current`` is ``None``), else
    ``Conflict`` carrying the current version so the caller can reload.
    """
    if current is None:
        return NotFound(f"{kind} not found")
    return Conflict(f"{kind} changed: expected version {expected}, found {current}", current_version=current)
