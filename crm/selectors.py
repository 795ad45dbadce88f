"""CRM reads: contacts, identities, segments and their members, import jobs, CSV export.

Lookups answer "not found" for missing and foreign objects alike (every read
is scoped to the caller's tenant by the store). Times are epoch milliseconds.
"""

from __future__ import annotations

import base64
import heapq
import itertools
import json
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from botmesh_admin.errors import NotFound, ValidationError, bounded
from botmesh_admin.pagination import Page, cursor_check, page_of, validate_limit
from botmesh_admin.validation import validate_text

from .domain import (
    ALL,
    CHANNELS,
    CONSENT_STATUSES,
    MAX_SEARCH_KEY,
    MEMBER,
    PLAN_VERDICTS,
    AttributeValue,
    Contact,
    Identity,
    ImportJob,
    Segment,
    SegmentRules,
    Term,
    attribute_term,
    consent_term,
    csvio,
    membership_groups,
    normalize_identity,
    normalize_tag,
    plan_group,
    plan_verdict,
    reachable_term,
    search_keys,
    search_match,
    search_terms,
    segment_rules_from_input,
    strict_equal,
    tag_term,
    validate_attributes,
)
from .stores import default_store
from .stores.base import ContactStore

SCAN_BATCH = 1000
SEGMENT_BATCH = 1000  # one get_many of records per batch
MAX_BATCH = 1000
PAGE_BUDGET_MIN = 200
PAGE_BUDGET_PER_ITEM = 10
MAX_PROBED_WORDS = 6
ID_CURSOR = re.compile(r"c_[0-9a-f]{22}")  # the id of a page's last contact (``new_id("c")``)
MAX_QUERY = 200  # characters of a text search (the API declares the same bound)
# A page's cursor: the last contact's id, or (text search) "q" + base64url of [search key, id].
CONTACT_CURSOR = re.compile(r"c_[0-9a-f]{22}|q[A-Za-z0-9_-]{4,1400}")
REGION_TTL_S = 60.0
_regions: dict[str, tuple[str, float]] = {}
_regions_lock = threading.Lock()


def tenant_region(tenant: str) -> str:
    """Return the tenant's default phone region (``Tenant.default_region``, "CO" if unset).

    Cached for a minute per process: the inbox calls this for every inbound message.
    """
    now = time.monotonic()
    with _regions_lock:
        cached = _regions.get(tenant)
    if cached and cached[1] > now:
        return cached[0]
    from botmesh_admin.tenancy.models import Tenant

    region = Tenant.objects.filter(id=tenant).values_list("default_region", flat=True).first() or "CO"
    with _regions_lock:
        _regions[tenant] = (region, now + REGION_TTL_S)
    return region


def tenant_region_forget(tenant: str | None = None) -> None:
    """Drop the cached region of ``tenant`` (or of every tenant) after it changed."""
    with _regions_lock:
        if tenant is None:
            _regions.clear()
        else:
            _regions.pop(tenant, None)


# --------------------------------------------------------------------------- contacts


def contact_get(tenant: str, contact_id: str) -> Contact:
    """Return the contact; raise ``NotFound`` if it is missing (or another tenant's)."""
    contact = default_store().contact_get(tenant, contact_id) if isinstance(contact_id, str) else None
    if contact is None:
        raise NotFound(f"contact {bounded(str(contact_id), 60)} not found")
    return contact


def contact_get_many(tenant: str, contact_ids: Sequence[str]) -> dict[str, Contact]:
    """Return the contacts of ``contact_ids`` that exist, by id (one ``get_many``: a page's contacts, O(page))."""
    wanted = list(dict.fromkeys(i for i in contact_ids if isinstance(i, str)))
    if not wanted:
        return {}
    return {c.id: c for c in default_store().contact_get_many(tenant, wanted) if c is not None}


def contact_find_by_identity(tenant: str, *, channel: str, address: str) -> Contact | None:
    """Return the contact owning the identity after normalisation, or ``None``.

    Raise ``ValidationError`` for an unknown channel or a malformed address.
    """
    identity = Identity(channel, normalize_identity(channel, address, tenant_region(tenant)))
    return default_store().contact_find(tenant, identity)


def contacts_find_by_identity(tenant: str, identities: Sequence[tuple[str, str]]) -> list[Contact | None]:
    """Return, for each ``(channel, address)`` in order, the contact owning it after normalisation, or ``None``.

    Two Kv reads per 1,000 identities. ``None`` also for an address that does not
    normalise (it can have no owner) and for an owner replaced between the reads.
    """
    region = tenant_region(tenant)
    normalised: list[Identity | None] = []
    for channel, address in identities:
        try:
            normalised.append(Identity(channel, normalize_identity(channel, address, region)))
        except ValidationError:
            normalised.append(None)
    known = [i for i in normalised if i is not None]
    found = iter(default_store().contact_find_many(tenant, known) if known else [])
    return [None if i is None else next(found) for i in normalised]


def _bad_cursor() -> ValidationError:
    return ValidationError("after", "not a cursor of this list (pass back the previous page's next)")


def _parse_identity_filter(identity: str, tenant: str) -> Identity:
    channel, sep, address = identity.partition(":")
    if not sep or channel not in CHANNELS:
        raise ValidationError("identity", f"use <channel>:<address> with channel one of {', '.join(CHANNELS)}")
    return Identity(channel, normalize_identity(channel, address, tenant_region(tenant), field="identity"))


def _parse_consent_filter(consent: str) -> tuple[str, str]:
    channel, sep, status = consent.partition(":")
    if not sep or channel not in CHANNELS or status not in CONSENT_STATUSES:
        raise ValidationError(
            "consent",
            f"use <channel>:<status> with channel one of {', '.join(CHANNELS)} "
            f"and status one of {', '.join(CONSENT_STATUSES)}",
        )
    return channel, status


ContactPage: TypeAlias = Page[Contact]
"""One page of contacts; pass ``next`` back as ``after`` for the following page.

A page may hold fewer than ``limit`` contacts (even none) and still have a
``next``: a filtered read stops after ``page_budget(limit)`` index entries
so that no request reads more than that; ``next`` is ``None`` only at the end.
"""


def _contact_id(contact: Contact) -> str:
    return contact.id


def page_budget(limit: int) -> int:
    """Return how many index entries one page of a filtered contact list reads at most."""
    return max(PAGE_BUDGET_MIN, PAGE_BUDGET_PER_ITEM * limit)


def _text_cursor(prefix: str, hit: tuple[str, str]) -> str:
    raw = json.dumps([prefix, *hit], ensure_ascii=False, separators=(",", ":")).encode()
    return "q" + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _read_text_cursor(after: str, text: list[str]) -> tuple[str, tuple[str, str]]:
    """Return ``(prefix walked, (key, contact id))`` of a search cursor for the search ``text``."""
    body = after[1:]
    try:
        value = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (ValueError, UnicodeDecodeError):
        value = None
    if (
        not isinstance(value, list)
        or len(value) != 3
        or not all(isinstance(v, str) for v in value)
        or value[0] not in {t[:MAX_SEARCH_KEY] for t in text}
        or not ID_CURSOR.fullmatch(value[2])
    ):
        raise _bad_cursor()
    return value[0], (value[1], value[2])


def _text_prefix(store: ContactStore, tenant: str, text: list[str], limit: int) -> str:
    """Return the search word to walk: the one with the fewest index entries.

    Each of the (at most ``MAX_PROBED_WORDS`` longest) words is probed with
    one scan of up to ``page_budget(limit)`` small index entries: a word whose
    probe ends early has an exact size, and the page walks it without running
    out of budget.
    """
    prefixes = list(dict.fromkeys(t[:MAX_SEARCH_KEY] for t in sorted(text, key=len, reverse=True)))
    if len(prefixes) == 1:
        return prefixes[0]
    budget = page_budget(limit)
    probes = {p: len(store.contact_search_scan(tenant, p, limit=budget)) for p in prefixes[:MAX_PROBED_WORDS]}
    return min(probes, key=probes.__getitem__)  # ties: the longest word


@dataclass(frozen=True)
class _Filters:
    """The filters of one contact list, checked on every fetched contact."""

    tag: str | None
    consent: tuple[str, str] | None  # (channel, status)
    attributes: Mapping[str, AttributeValue]
    text: list[str] | None

    def required(self) -> list[Term]:
        """Return the posting lists a contact must be under."""
        out: list[Term] = []
        if self.tag is not None:
            out.append(tag_term(self.tag))
        if self.consent is not None and self.consent[1] != "unknown":
            out.append(consent_term(*self.consent))
        out += [attribute_term(name, value) for name, value in self.attributes.items()]
        return out

    def forbidden(self) -> list[Term]:
        """Return the posting lists a contact must not be under (consent ``unknown``: neither other status)."""
        if self.consent is None or self.consent[1] != "unknown":
            return []
        return [consent_term(self.consent[0], "granted"), consent_term(self.consent[0], "denied")]

    def keep(self, contact: Contact, keys: set[str] | None = None) -> bool:
        """Return True if ``contact`` passes every filter (``keys``: its search keys, if computed already)."""
        if self.tag is not None and self.tag not in contact.tags:
            return False
        if self.consent is not None and contact.consent_status(self.consent[0]) != self.consent[1]:
            return False
        for name, want in self.attributes.items():
            if name not in contact.attributes or not strict_equal(contact.attributes[name], want):
                return False
        if self.text is not None and not search_match(
            self.text, keys if keys is not None else _contact_search_keys(contact)
        ):
            return False
        return True


def _contact_search_keys(contact: Contact) -> set[str]:
    return search_keys(contact.name, ((i.channel, i.address) for i in contact.identities))


def contact_list(
    tenant: str,
    *,
    limit: int = 50,
    after: str | None = None,
    tag: str | None = None,
    q: str | None = None,
    identity: str | None = None,
    consent: str | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> ContactPage:
    """Return a page of contacts filtered by tag, consent, attributes, text and identity.

    ``tag`` is one tag; ``consent`` is ``<channel>:<status>`` (``whatsapp:granted``;
    ``unknown`` is a contact never asked); ``attributes`` maps names to values
    compared strictly (``"1"`` is not ``1`` nor ``true``); ``q`` is a text
    search: every word must start a word of the name, an email (or one of its
    words) or a phone number's digits in international or national form
    (``300 111`` finds ``+57 300 1112233``), ignoring case and accents;
    ``identity`` is ``<channel>:<address>`` (normalised first, the one owner).
    ``limit`` is 1..200; ``q`` at most ``MAX_QUERY`` (200) characters of one
    line. Raise ``ValidationError`` for a bad filter or cursor.

    Order: by id (creation time), except a text search read from the search
    index, which lists by the contact's first word matching one of the search
    words (alphabetically), then by id, each contact once. ``next`` is opaque:
    pass it back as ``after``.

    Cost: no filter, limit + 1 records. One filter with a posting list (a
    tag, consent granted or denied, one attribute): that list is walked, each
    batch of its entries read with their records in one round trip
    (``contact_term_page``). With more filters, the counts of the filters'
    posting lists are read (one ``get_many``), the smallest list is walked in
    id order, the other filters are checked on their index entries (one
    small entry per candidate and filter) and only the candidates left are
    fetched and checked again. A text search alone (its entries and records
    read together, ``contact_search_page``), or with filters whose
    smallest list is longer than the page budget, walks the search index
    instead, under the search word with the fewest entries (with several
    words, each is first probed with one scan of up to the page budget of
    small entries), the filters checked the same way. Either way a page walks
    at most ``page_budget(limit)`` entries of the list it reads (10 per item,
    at least 200) and returns ``next`` where it stopped.
    """
    validate_limit(limit)
    after = cursor_check(after, CONTACT_CURSOR)
    if q is not None:
        validate_text(q, "q", max_len=MAX_QUERY, blank=True)
    store = default_store()
    if identity:
        if after is not None and not ID_CURSOR.fullmatch(after):
            raise _bad_cursor()
        found = store.contact_find(tenant, _parse_identity_filter(identity, tenant))
        return ContactPage([found] if found and (after is None or found.id > after) else [], None)
    text = search_terms(q) if q and q.strip() else None
    filters = _Filters(
        tag=normalize_tag(tag, "tag") if tag else None,
        consent=_parse_consent_filter(consent) if consent else None,
        attributes=validate_attributes(attributes or {}, "attributes"),
        text=text,
    )
    if text == []:
        return ContactPage([], None)  # a query without letters or digits matches nothing
    required, forbidden = filters.required(), filters.forbidden()
    if after is not None and after.startswith("q"):
        if text is None:
            raise _bad_cursor()
        prefix, position = _read_text_cursor(after, text)
        return _text_page(store, tenant, filters, required, forbidden, prefix, position, limit)
    if not required and not forbidden:
        if text is not None:
            if after is not None:
                raise _bad_cursor()
            prefix = _text_prefix(store, tenant, text, limit)
            return _text_page(store, tenant, filters, [], [], prefix, None, limit)
        return page_of(store.contact_scan(tenant, after=after, limit=limit + 1), limit, _contact_id)
    if len(required) == 1 and not forbidden and text is None:
        # One posting list and nothing to choose: it drives, and no counter needs reading.
        return _term_page(store, tenant, filters, required[0], [], [], after, limit)
    counts = dict(
        zip([ALL, *required, *forbidden], store.contact_count(tenant, [ALL, *required, *forbidden]), strict=True)
    )
    required.sort(key=counts.__getitem__)  # the most selective first: it drives, the rest shrink it fastest
    # Consent unknown is every contact less the other two statuses: walked as all contacts.
    unknown = counts[ALL] - sum(counts[t] for t in forbidden) if forbidden else None
    driver = required[0] if required and (unknown is None or counts[required[0]] <= unknown) else None
    smallest = counts[driver] if driver is not None else unknown
    assert smallest is not None
    if text is not None and after is None and smallest > page_budget(limit):
        prefix = _text_prefix(store, tenant, text, limit)
        return _text_page(store, tenant, filters, required, forbidden, prefix, None, limit)
    others = [t for t in required if t != driver]
    return _term_page(store, tenant, filters, driver, others, forbidden, after, limit)


def _batches(limit: int, budget: int) -> Iterator[int]:
    """Yield batch sizes: a page and one first, then doubling, until ``budget`` is read."""
    size, read = limit + 1, 0
    while read < budget:
        size = min(size, budget - read, MAX_BATCH)
        yield size
        read += size
        size *= 2


def _having(store: ContactStore, tenant: str, ids: list[str], term: Term, *, present: bool = True) -> list[str]:
    """Return the ``ids`` listed (``present``) or not listed under ``term``: index entries only."""
    if not ids:
        return ids
    return [i for i, has in zip(ids, store.contact_has_term(tenant, term, ids), strict=True) if has is present]


def _shrink(store: ContactStore, tenant: str, ids: list[str], required: list[Term], forbidden: list[Term]) -> list[str]:
    """Return the ``ids`` under every ``required`` list and no ``forbidden`` one (index entries only)."""
    for term in required:
        ids = _having(store, tenant, ids, term)
    for term in forbidden:
        ids = _having(store, tenant, ids, term, present=False)
    return ids


def _term_page(
    store: ContactStore,
    tenant: str,
    filters: _Filters,
    driver: Term | None,
    required: list[Term],
    forbidden: list[Term],
    after: str | None,
    limit: int,
) -> ContactPage:
    """Walk the posting list of ``driver`` (``None``: every contact) by id; keep what every filter accepts.

    ``required`` / ``forbidden`` are checked on their index entries first, so
    only candidates that pass them are fetched; the filters are checked again
    on the fetched contacts (one may have changed since its entries were read).
    """
    items: list[Contact] = []
    cursor = after
    for size in _batches(limit, page_budget(limit)):
        if driver is None:
            walked = store.contact_scan(tenant, after=cursor, limit=size)
            ids, contacts = [c.id for c in walked], list[Contact | None](walked)
        elif not required and not forbidden:
            # Nothing to check on index entries first: the page and its contacts in one read.
            pairs = store.contact_term_page(tenant, driver, after=cursor, limit=size)
            ids, contacts = [i for i, _ in pairs], [c for _, c in pairs]
        else:
            ids = store.contact_term_scan(tenant, driver, after=cursor, limit=size)
            contacts = store.contact_get_many(tenant, _shrink(store, tenant, ids, required, forbidden))
        for contact in contacts:
            if contact is None or not filters.keep(contact):
                continue  # erased or changed since the index entry was read
            items.append(contact)
            if len(items) > limit:
                return page_of(items, limit, _contact_id)
        if len(ids) < size:
            return ContactPage(items, None)
        cursor = ids[-1]
    return ContactPage(items, cursor)


def _text_page(
    store: ContactStore,
    tenant: str,
    filters: _Filters,
    required: list[Term],
    forbidden: list[Term],
    prefix: str,
    after: tuple[str, str] | None,
    limit: int,
) -> ContactPage:
    """Walk the search index under ``prefix`` (one search word); list each contact under its first matching key.

    ``required`` / ``forbidden`` (the other filters) are checked on their index
    entries before the candidates are fetched, as in ``_term_page``.
    """
    items: list[tuple[Contact, tuple[str, str]]] = []
    cursor = after
    for size in _batches(limit, page_budget(limit)):
        if not required and not forbidden:
            pairs = store.contact_search_page(tenant, prefix, after=cursor, limit=size)
            hits = [hit for hit, _ in pairs]
            fetched = {hit[1]: contact for hit, contact in pairs}
        else:
            hits = store.contact_search_scan(tenant, prefix, after=cursor, limit=size)
            candidates = _shrink(store, tenant, list(dict.fromkeys(i for _, i in hits)), required, forbidden)
            fetched = dict(zip(candidates, store.contact_get_many(tenant, candidates), strict=True))
        for hit in hits:
            cursor = hit
            contact = fetched.get(hit[1])
            if contact is None:
                continue
            keys = _contact_search_keys(contact)  # once per contact: folding names is what a page costs
            if not filters.keep(contact, keys):
                continue
            index_keys = {k[:MAX_SEARCH_KEY] for k in keys}  # as ``search_index_keys`` holds them
            if hit[0] != min((k for k in index_keys if k.startswith(prefix)), default=None):
                continue  # listed under an earlier key of this contact (or no longer under this one)
            items.append((contact, hit))
            if len(items) > limit:
                page = page_of(items, limit, lambda item: _text_cursor(prefix, item[1]))
                return ContactPage([c for c, _ in page.items], page.next)
        if len(hits) < size:
            return ContactPage([c for c, _ in items], None)
    assert cursor is not None
    return ContactPage([c for c, _ in items], _text_cursor(prefix, cursor))


def contact_count(tenant: str) -> int:
    """Return how many contacts the tenant has (one counter read)."""
    return default_store().contact_count(tenant, [ALL])[0]


def contact_iter(tenant: str, *, batch: int = SCAN_BATCH) -> Iterator[Contact]:
    """Yield every contact of the tenant, by id, reading ``batch`` at a time."""
    store = default_store()
    cursor: str | None = None
    while True:
        page = store.contact_scan(tenant, after=cursor, limit=batch)
        yield from page
        if len(page) < batch:
            return
        cursor = page[-1].id


def contact_export_csv(tenant: str) -> Iterator[str]:
    """Yield the tenant's contacts as CSV text (see ``crm.domain.csvio``); it imports back to the same contacts."""
    columns = csvio.export_columns(contact_iter(tenant))
    yield from csvio.format_csv([columns])
    yield from csvio.format_csv(csvio.export_row(columns, c) for c in contact_iter(tenant))


# --------------------------------------------------------------------------- segments


def segment_get(tenant: str, segment_id: str) -> Segment:
    """Return the segment; raise ``NotFound``."""
    segment = default_store().segment_get(tenant, segment_id) if isinstance(segment_id, str) else None
    if segment is None:
        raise NotFound(f"segment {bounded(str(segment_id), 60)} not found")
    return segment


def segment_list(tenant: str, *, limit: int = 200, after: str | None = None) -> list[Segment]:
    """Return the tenant's segments ordered by id (creation time)."""
    return default_store().segment_scan(tenant, after=after, limit=limit)


def _rules(tenant: str, segment_id_or_rules: str | SegmentRules | Mapping[str, Any]) -> SegmentRules:
    if isinstance(segment_id_or_rules, str):
        return segment_get(tenant, segment_id_or_rules).rules
    if isinstance(segment_id_or_rules, SegmentRules):
        return segment_id_or_rules
    return segment_rules_from_input(segment_id_or_rules)


@dataclass(frozen=True)
class _SegmentPlan:
    """How a segment's members are read: the posting lists that drive, or every contact.

    ``sources`` are the rules' positive conditions, each a list of terms whose
    union it is (``tags_any``; one term for the others); ``excluded`` are the
    ``tags_none`` terms.
    """

    rules: SegmentRules
    sources: tuple[tuple[Term, ...], ...]
    excluded: tuple[Term, ...]

    @classmethod
    def of(cls, rules: SegmentRules) -> _SegmentPlan:
        sources: list[tuple[Term, ...]] = [(tag_term(t),) for t in rules.tags_all]
        sources += [(attribute_term(n, v),) for n, v in rules.attributes.items()]
        if rules.consent_required:
            sources.append((reachable_term(rules.consent_required),))
        if rules.tags_any:
            sources.append(tuple(tag_term(t) for t in rules.tags_any))
        return cls(rules, tuple(sources), tuple(tag_term(t) for t in rules.tags_none))

    def terms(self) -> list[Term]:
        """Return every term whose count the plan needs (``ALL`` included)."""
        return [ALL, *(t for source in self.sources for t in source), *self.excluded]

    def driver(self, counts: Mapping[Term, int]) -> tuple[Term, ...] | None:
        """Return the positive condition with the fewest contacts (a union counts its lists' sum)."""
        if not self.sources:
            return None
        return min(self.sources, key=lambda source: sum(counts[t] for t in source))


def _growing(first: int) -> Iterator[int]:
    """Yield batch sizes from ``first`` doubling up to ``SEGMENT_BATCH`` (a sample reads little)."""
    size = max(1, min(first, SEGMENT_BATCH))
    while True:
        yield size
        size = min(size * 2, SEGMENT_BATCH)


def _term_ids(store: ContactStore, tenant: str, term: Term, first: int) -> Iterator[str]:
    """Yield the ids of ``term``'s posting list, by id, in batches growing from ``first``."""
    cursor: str | None = None
    for size in _growing(first):
        ids = store.contact_term_scan(tenant, term, after=cursor, limit=size)
        yield from ids
        if len(ids) < size:
            return
        cursor = ids[-1]


def _union_ids(store: ContactStore, tenant: str, terms: tuple[Term, ...], first: int) -> Iterator[str]:
    """Yield the ids listed under any of ``terms``, by id, once each (a merge of the sorted lists)."""
    if len(terms) == 1:
        yield from _term_ids(store, tenant, terms[0], first)
        return
    last: str | None = None
    for contact_id in heapq.merge(*(_term_ids(store, tenant, t, first) for t in terms)):
        if contact_id != last:
            yield contact_id
            last = contact_id


def _batched(ids: Iterator[str], first: int) -> Iterator[list[str]]:
    for size in _growing(first):
        batch = list(itertools.islice(ids, size))
        if not batch:
            return
        yield batch


def _read_counts(store: ContactStore, tenant: str, plans: list[_SegmentPlan]) -> dict[Term, int]:
    terms = list(dict.fromkeys(t for plan in plans for t in plan.terms()))
    return dict(zip(terms, store.contact_count(tenant, terms), strict=True))


def _filter_ids(
    store: ContactStore,
    tenant: str,
    plan: _SegmentPlan,
    driver: tuple[Term, ...],
    counts: Mapping[Term, int],
    ids: list[str],
) -> list[str]:
    """Return the ``ids`` (of the driver's list) that meet every other condition, by index entries only."""
    others = sorted((s for s in plan.sources if s is not driver), key=lambda s: sum(counts[t] for t in s))
    for source in others:
        if len(source) == 1:
            ids = _having(store, tenant, ids, source[0])
        elif ids:
            hits = [store.contact_has_term(tenant, t, ids) for t in source]
            ids = [i for i, *has in zip(ids, *hits, strict=True) if any(has)]
    for term in plan.excluded:
        ids = _having(store, tenant, ids, term, present=False)
    return ids


def _count(store: ContactStore, tenant: str, plan: _SegmentPlan, counts: Mapping[Term, int]) -> int:
    """Return the exact number of members; see ``segment_count`` for the cost."""
    driver = plan.driver(counts)
    if driver is None:
        if not plan.excluded:
            return counts[ALL]
        if len(plan.excluded) == 1:
            return counts[ALL] - counts[plan.excluded[0]]
        return counts[ALL] - sum(1 for _ in _union_ids(store, tenant, plan.excluded, SEGMENT_BATCH))
    if len(plan.sources) == 1 and not plan.excluded and len(driver) == 1:
        return counts[driver[0]]  # one condition: its counter is the answer
    if sum(counts[t] for t in driver) == 0:
        return 0
    ids = _union_ids(store, tenant, driver, SEGMENT_BATCH)
    return sum(len(_filter_ids(store, tenant, plan, driver, counts, batch)) for batch in _batched(ids, SEGMENT_BATCH))


def _members(
    store: ContactStore, tenant: str, plan: _SegmentPlan, counts: Mapping[Term, int], first: int = SEGMENT_BATCH
) -> Iterator[Contact]:
    """Yield the members by id, reading batches that grow from ``first`` to ``SEGMENT_BATCH``.

    Only the ids that pass every condition's index entries are fetched, and
    the rules are tested again on the fetched contacts.
    """
    driver = plan.driver(counts)
    if driver is None:
        cursor: str | None = None
        for size in _growing(first):
            matches, cursor = store.contact_scan_matching(tenant, plan.rules, after=cursor, limit=size)
            yield from matches
            if cursor is None:
                break
        return
    for batch in _batched(_union_ids(store, tenant, driver, first), first):
        yield from store.contact_match(tenant, _filter_ids(store, tenant, plan, driver, counts, batch), plan.rules)


def segment_members(tenant: str, segment_id_or_rules: str | SegmentRules | Mapping[str, Any]) -> Iterator[Contact]:
    """Yield the contacts matching a saved segment (by id) or unsaved rules, by contact id.

    Streams with bounded memory: one batch of ``SEGMENT_BATCH`` (1,000) contacts
    at a time (times the number of ``tags_any`` tags when those drive), so a
    campaign can plan over a million members. The read walks the posting list
    of the rules' most selective positive condition (fewest contacts by count:
    a tag of ``tags_all``, an attribute value, ``consent_required``'s reachable
    list, or the merged lists of ``tags_any``), checks the other conditions on
    their index entries and fetches only the members (whose rules are tested
    again on the record): O(that list × conditions) small entries plus the
    members. Rules with only ``tags_none`` (or none) walk every contact. Raise ``NotFound`` for an unknown segment id,
    ``ValidationError`` for bad rules (both before the first contact is yielded).
    """
    plan = _SegmentPlan.of(_rules(tenant, segment_id_or_rules))
    store = default_store()
    counts = _read_counts(store, tenant, [plan])
    return _members(store, tenant, plan, counts)


def _saved(tenant: str, segment_id_or_rules: str | SegmentRules | Mapping[str, Any]) -> Segment | None:
    """Return the saved segment when given its id (its membership may be materialized), else ``None``."""
    return segment_get(tenant, segment_id_or_rules) if isinstance(segment_id_or_rules, str) else None


def segment_count(tenant: str, segment_id_or_rules: str | SegmentRules | Mapping[str, Any]) -> int:
    """Return how many contacts match now (a live, exact count).

    Cost: a saved segment whose membership is built (``ContactStore.membership_counts``:
    kept in every contact's commit) is one counter, O(1). Otherwise (unsaved
    rules, or a segment created or changed whose membership is still being
    built): the counters of the rules' terms (one ``get_many``); a single
    condition (one tag, one attribute value, ``consent_required``, one
    ``tags_none`` tag, or no rule) is answered by them alone, O(1). Several
    conditions walk the posting list with the fewest contacts and check each
    other condition on its index entry for those ids (one small entry per
    candidate and condition, most selective first, so the candidates shrink),
    never fetching a contact: O(smallest list × conditions). Only ``tags_none``
    with several tags (and nothing else) reads their lists' ids, O(their sum).
    """
    store = default_store()
    saved = _saved(tenant, segment_id_or_rules)
    if saved is not None:
        built = store.membership_counts(tenant, [saved], [MEMBER])
        if saved.id in built:
            return built[saved.id][0]
    plan = _SegmentPlan.of(saved.rules if saved is not None else _rules(tenant, segment_id_or_rules))
    return _count(store, tenant, plan, _read_counts(store, tenant, [plan]))


@dataclass(frozen=True)
class SegmentPreview:
    """The live count and the first ``limit`` members."""

    count: int
    sample: list[Contact]


def _first_members(
    store: ContactStore, tenant: str, segment: Segment, group: tuple[str, ...], limit: int
) -> list[Contact] | None:
    """Return the first ``limit`` contacts of a built membership ``group`` (checked again on the records)."""
    ids = store.membership_scan(tenant, segment, group, limit=limit)
    if ids is None:
        return None
    contacts = [c for c in store.contact_get_many(tenant, ids) if c is not None]
    # A contact written after its index entry was read is judged on the record as fetched.
    return [c for c in contacts if group in membership_groups(segment.rules, c.to_json())]


def segment_preview(
    tenant: str, segment_id_or_rules: str | SegmentRules | Mapping[str, Any], *, limit: int = 20
) -> SegmentPreview:
    """Return the live count and the first ``limit`` (0..200) members (by id).

    A saved segment with built membership costs one counter and one page of
    its membership index with the members' records, O(limit). Otherwise the
    count costs what ``segment_count`` costs and the sample walks the same
    posting list until ``limit`` members are found.
    """
    validate_limit(limit, minimum=0)
    store = default_store()
    saved = _saved(tenant, segment_id_or_rules)
    if saved is not None:
        built = store.membership_counts(tenant, [saved], [MEMBER])
        if saved.id in built:
            count = built[saved.id][0]
            sample = _first_members(store, tenant, saved, MEMBER, limit) if count and limit else []
            return SegmentPreview(count, sample or [])
    plan = _SegmentPlan.of(saved.rules if saved is not None else _rules(tenant, segment_id_or_rules))
    counts = _read_counts(store, tenant, [plan])
    count = _count(store, tenant, plan, counts)
    members = _members(store, tenant, plan, counts, first=limit + 1)
    sample = list(itertools.islice(members, limit)) if count and limit else []
    return SegmentPreview(count, sample)


def segment_counts(tenant: str, segments: list[Segment]) -> dict[str, int]:
    """Return the live count of each segment (the segments page).

    The segments whose membership is built: one counter each, read together
    (O(1) per segment). The others (just created or changed, still building)
    cost what ``segment_count`` costs on the posting lists.
    """
    store = default_store()
    built = store.membership_counts(tenant, segments, [MEMBER])
    plans = {s.id: _SegmentPlan.of(s.rules) for s in segments if s.id not in built}
    counts = _read_counts(store, tenant, list(plans.values())) if plans else {}
    out = {s.id: built[s.id][0] for s in segments if s.id in built}
    out.update({segment_id: _count(store, tenant, plan, counts) for segment_id, plan in plans.items()})
    return {s.id: out[s.id] for s in segments}


def segment_membership_pending(tenant: str, *, sweep: bool = False) -> list[str]:
    """Return the ids of the segments whose materialized membership is still being built.

    ``sweep``: include ``"sweep"`` when a deleted or changed segment's old
    membership waits to be cleared from the contacts (the build job's work too).
    """
    return [sid for sid in default_store().membership_pending(tenant) if sweep or sid != "sweep"]


@dataclass(frozen=True)
class SegmentReach:
    """What a campaign to a segment on one channel would decide, from the segment's membership.

    ``contacts``: every contact of the tenant; ``verdicts``: how many of the
    segment's audience get each of ``PLAN_VERDICTS`` (``ok`` = a recipient);
    ``examples``: the first contacts (by id) of each verdict and of
    ``not_in_segment``, among the first ``REACH_EXAMPLE_BUDGET`` members and
    contacts read.
    """

    contacts: int
    verdicts: dict[str, int]
    examples: dict[str, list[Contact]]


REACH_EXAMPLE_BUDGET = 50  # members, and contacts, read at most to find the examples (a page each)


def segment_reach(tenant: str, segment_id: str, *, channel: str, examples: int = 10) -> SegmentReach | None:
    """Return a campaign's counts for ``segment_id`` on ``channel`` in O(page), or ``None`` if not built.

    Counts are the membership counters (exact, kept in each contact's
    commit: ``crm.domain.membership_groups``); the examples are found among
    the first ``REACH_EXAMPLE_BUDGET`` members and the first as many contacts,
    judged with ``plan_verdict``. Raise ``NotFound`` for an unknown segment.
    """
    segment = segment_get(tenant, segment_id)
    store = default_store()
    left_out = [v for v in PLAN_VERDICTS if v != "ok"]
    built = store.membership_counts(tenant, [segment], [MEMBER, *(plan_group(channel, v) for v in left_out)])
    if segment.id not in built:
        return None
    members, *counts = built[segment.id]
    verdicts = dict(zip(left_out, counts, strict=True))
    # The groups hold members, unless consent on this very channel is a rule: then every member is a recipient.
    verdicts["ok"] = members if segment.rules.consent_required == channel else members - sum(counts)
    total = store.contact_count(tenant, [ALL])[0]
    found: dict[str, list[Contact]] = {}
    if examples:
        ids = store.membership_scan(tenant, segment, MEMBER, limit=REACH_EXAMPLE_BUDGET) or []
        walked = [c for c in store.contact_get_many(tenant, ids) if c is not None]
        if total > members:
            walked = sorted(
                {c.id: c for c in [*walked, *store.contact_scan(tenant, limit=REACH_EXAMPLE_BUDGET)]}.values(),
                key=lambda c: c.id,
            )
        for contact in walked:
            verdict = plan_verdict(segment.rules, contact.to_json(), channel) or "not_in_segment"
            if len(found.setdefault(verdict, [])) < examples:
                found[verdict].append(contact)
    return SegmentReach(total, {v: verdicts[v] for v in PLAN_VERDICTS}, {k: v for k, v in found.items() if v})


# --------------------------------------------------------------------------- imports


def import_job_get(tenant: str, job_id: str) -> ImportJob:
    """Return the import job with its progress and report; raise ``NotFound``."""
    job = default_store().import_job_get(tenant, job_id) if isinstance(job_id, str) else None
    if job is None:
        raise NotFound(f"import {bounded(str(job_id), 60)} not found")
    return job


def import_job_list(tenant: str, *, limit: int = 20) -> list[ImportJob]:
    """Return the ``limit`` (1..200) most recent import jobs, newest first (one index page)."""
    validate_limit(limit)
    return default_store().import_job_newest(tenant, limit=limit)
