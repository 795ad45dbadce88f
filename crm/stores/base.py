"""The contract of every CRM store (enforced by ``tests/crm/test_store_contract.py``).

A store persists what the services already validated; it knows nothing of HTTP,
Celery or settings. Every method is tenant-scoped: nothing reads across
tenants, and another tenant's object is simply absent.

Rules every implementation keeps:

- A contact's identities are unique per tenant. Inserting or replacing a
  contact claims its identities in the same atomic write as the contact itself;
  if any identity belongs to another contact nothing is written and
  ``IdentityTaken`` names it. Two concurrent inserts of one new identity leave
  exactly one contact.
- ``version`` starts at 1 and grows by one with every write of the object;
  a write with a stale ``expected_version`` raises ``Conflict`` carrying the
  current version, and a missing object raises ``NotFound``.
- Deleting a contact deletes its identities and writes the given suppression
  entries in the same atomic write.
- Listings are ordered by id (ids sort by creation time) and paginated with an
  exclusive ``after`` cursor.
- Every contact is listed under its terms (``crm.domain.contact_terms``: tags,
  consent granted / denied per channel, reachable channels, typed attribute
  values) and its search keys (``crm.domain.search_index_keys``), exactly as
  it is now: the posting lists, their counts and the search entries change in
  the same atomic write as the contact. The Kv store reads them from indexes (a page is O(page),
  a count O(1)); the memory store, the reference, computes them from its
  contacts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from botmesh_admin.errors import Conflict
from crm.domain import MEMBER, Contact, Group, Identity, ImportJob, Segment, SegmentRules, Term

MAX_SCAN = 5000
MAX_PAGE_FETCH = 1000  # ids and their contacts per call of contact_term_page / contact_search_page


class StaleRevision(Conflict):
    """What a write read moved before its compare-and-set (nothing was written): read again and retry.

    Raised by ``membership_sync``; the services retry only it
    (``cas_retry(..., retry_on=StaleRevision)``), never another ``Conflict``
    such as a store's own exhausted retries. HTTP 409 ``conflict``.
    """


"""The largest ``limit`` of a store scan (checked with ``pagination.validate_limit``)."""


@runtime_checkable
class ContactStore(Protocol):
    """Contacts with their identity index and suppression list, segments and import jobs."""

    # contacts ---------------------------------------------------------------

    def contact_get(self, tenant: str, contact_id: str) -> Contact | None:
        """Return the contact with ``contact_id``, or ``None`` if it does not exist."""
        ...

    def contact_find(self, tenant: str, identity: Identity) -> Contact | None:
        """Return the contact that owns the (normalised) ``identity``, or ``None``."""
        ...

    def contact_find_many(self, tenant: str, identities: Sequence[Identity]) -> list[Contact | None]:
        """Return, for each (normalised) identity in order, its owner or ``None``: two reads per 1,000.

        An owner replaced between the two reads shows as ``None`` (ask ``contact_find``).
        """
        ...

    def contact_insert(self, tenant: str, contact: Contact) -> Contact:
        """Store a new contact and claim its identities atomically; return it at version 1.

        Raise ``IdentityTaken`` if an identity belongs to another contact, and
        ``Conflict`` if the id exists already. On error nothing is written.
        """
        ...

    def contact_replace(
        self,
        tenant: str,
        contact: Contact,
        *,
        expected_version: int,
        release_suppressions: tuple[str, ...] = (),
    ) -> Contact:
        """Replace a contact if its version is ``expected_version``; return it at the next version.

        Identities added since the stored version are claimed and removed ones
        released in the same atomic write; the suppression entries whose keys
        are in ``release_suppressions`` are deleted in it too. Raise
        ``NotFound`` (absent), ``Conflict`` with ``current_version`` (stale) or
        ``IdentityTaken``; on error nothing is written.
        """
        ...

    def contact_delete(
        self,
        tenant: str,
        contact_id: str,
        *,
        expected_version: int,
        suppressions: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """Delete a contact and release its identities; write ``suppressions`` (key → record).

        All in one atomic write. Raise ``NotFound`` or ``Conflict`` as for replace.
        """
        ...

    def contact_scan(self, tenant: str, *, after: str | None = None, limit: int = 100) -> list[Contact]:
        """Return up to ``limit`` (1..5000) contacts with id greater than ``after``, by id."""
        ...

    def contact_scan_matching(
        self, tenant: str, rules: SegmentRules, *, after: str | None = None, limit: int = 1000
    ) -> tuple[list[Contact], str | None]:
        """Look at up to ``limit`` (1..5000) contacts after ``after``; return those matching ``rules``.

        The second item is the cursor to pass as ``after`` for the rest, or
        ``None`` when the scan reached the end. (A store may test the rules on
        its stored form before decoding, which is what makes segments fast.)
        """
        ...

    def contact_get_many(self, tenant: str, contact_ids: Sequence[str]) -> list[Contact | None]:
        """Return, for each id in order, the contact or ``None`` (one round trip per 1,000 ids)."""
        ...

    def contact_count(self, tenant: str, terms: Sequence[Term]) -> list[int]:
        """Return how many contacts each term lists (``ALL``: every contact); O(1) per term."""
        ...

    def contact_term_scan(self, tenant: str, term: Term, *, after: str | None = None, limit: int = 1000) -> list[str]:
        """Return up to ``limit`` (1..5000) ids of contacts listed under ``term``, by id, after ``after``.

        O(limit) entries read; ``ALL`` is not a list (use ``contact_scan``).
        """
        ...

    def contact_term_page(
        self, tenant: str, term: Term, *, after: str | None = None, limit: int = 1000
    ) -> list[tuple[str, Contact | None]]:
        """Return ``contact_term_scan``'s ids (``limit`` 1..1000), each with its contact as stored.

        The contact is ``None`` when it was erased since it was listed; it may
        have changed too (a reader checks its filters on it again). One round
        trip on the Kv store (the index page and the records at one instant).
        """
        ...

    def contact_has_term(self, tenant: str, term: Term, contact_ids: Sequence[str]) -> list[bool]:
        """Return, for each id in order, True if that contact is listed under ``term``.

        Reads one small index entry per id (no contact record): how an
        intersection checks its other conditions before fetching anything.
        """
        ...

    def contact_search_scan(
        self, tenant: str, prefix: str, *, after: tuple[str, str] | None = None, limit: int = 1000
    ) -> list[tuple[str, str]]:
        """Return up to ``limit`` (1..5000) ``(search key, contact id)`` pairs whose key starts with ``prefix``.

        Ordered by key (code point order), then contact id; ``after`` is the last
        pair of the previous page (exclusive). A contact appears once per
        matching key. O(limit) entries read. Raise ``ValidationError`` (field
        ``after``) when ``after``'s key does not start with ``prefix``.
        """
        ...

    def contact_search_page(
        self, tenant: str, prefix: str, *, after: tuple[str, str] | None = None, limit: int = 1000
    ) -> list[tuple[tuple[str, str], Contact | None]]:
        """Return ``contact_search_scan``'s pairs (``limit`` 1..1000), each with its contact as stored.

        As ``contact_term_page``: ``None`` for an erased contact, one round trip on the Kv store.
        """
        ...

    def contact_match(self, tenant: str, contact_ids: Sequence[str], rules: SegmentRules) -> list[Contact]:
        """Return the contacts among ``contact_ids`` (in that order) that exist and match ``rules``."""
        ...

    def contact_match_count(self, tenant: str, contact_ids: Sequence[str], rules: SegmentRules) -> int:
        """Return how many of ``contact_ids`` exist and match ``rules`` (the rules tested on the stored form)."""
        ...

    # suppression list -------------------------------------------------------

    def suppression_get(self, tenant: str, key: str) -> Mapping[str, Any] | None:
        """Return the suppression record stored under ``key`` (a keyed hash), or ``None``."""
        ...

    # segments ---------------------------------------------------------------

    def segment_get(self, tenant: str, segment_id: str) -> Segment | None:
        """Return the segment, or ``None``."""
        ...

    def segment_insert(self, tenant: str, segment: Segment) -> Segment:
        """Store a new segment at version 1; raise ``Conflict`` if the id exists."""
        ...

    def segment_replace(self, tenant: str, segment: Segment, *, expected_version: int) -> Segment:
        """Replace a segment if its version is ``expected_version``; raise ``NotFound``/``Conflict``."""
        ...

    def segment_delete(self, tenant: str, segment_id: str) -> bool:
        """Delete a segment; return False if it did not exist."""
        ...

    def segment_scan(self, tenant: str, *, after: str | None = None, limit: int = 100) -> list[Segment]:
        """Return up to ``limit`` segments with id greater than ``after``, by id."""
        ...

    # segment membership -----------------------------------------------------

    def membership_sync(self, tenant: str, segments: Sequence[Segment]) -> None:
        """Make the membership definitions the given ``segments`` (every saved segment of the tenant).

        Membership is kept per segment and rules key (``segment_rules_key``):
        a renamed segment keeps it; a new or changed one is not built until
        ``membership_build`` ran (at once in a tenant without contacts).
        Raise ``StaleRevision`` if the stored definitions moved since they were
        read (nothing written): read the segments again and call it again.
        """
        ...

    def membership_pending(self, tenant: str) -> list[str]:
        """Return the ids of the segments whose membership is not built yet (``"sweep"``: a clean-up is due)."""
        ...

    def membership_build(self, tenant: str, *, batch: int = 500, progress: Callable[[int], None] | None = None) -> int:
        """Bring every contact's membership up to the definitions (online, resumable); return contacts read."""
        ...

    def membership_counts(
        self, tenant: str, segments: Sequence[Segment], groups: Sequence[Group]
    ) -> dict[str, list[int]]:
        """Return, for each of ``segments`` whose membership is built, the number of contacts in each group.

        Groups: ``MEMBER`` (matches the rules) and ``plan_group(channel,
        verdict)`` (what a campaign to the segment on ``channel`` decides,
        ``crm.domain.membership_groups``). O(1) per segment and group; a segment
        not built is absent from the answer.
        """
        ...

    def membership_scan(
        self, tenant: str, segment: Segment, group: Group = MEMBER, *, after: str | None = None, limit: int = 100
    ) -> list[str] | None:
        """Return up to ``limit`` (1..5000) ids in ``group`` of ``segment``, by id, after ``after`` (O(limit)).

        ``None`` when the segment's membership is not built for its current rules.
        """
        ...

    def membership_check(self, tenant: str) -> dict[str, int]:
        """Compare each contact's stored membership with the built definitions (a full scan).

        Return ``{"contacts", "wrong"}``.
        """
        ...

    # import jobs ------------------------------------------------------------

    def import_job_insert(self, tenant: str, job: ImportJob, data: str) -> ImportJob:
        """Store a new import job at version 1 together with its CSV text ``data``."""
        ...

    def import_job_get(self, tenant: str, job_id: str) -> ImportJob | None:
        """Return the import job, or ``None``."""
        ...

    def import_job_replace(self, tenant: str, job: ImportJob, *, expected_version: int) -> ImportJob:
        """Replace an import job if its version is ``expected_version``; raise ``NotFound``/``Conflict``."""
        ...

    def import_job_scan(self, tenant: str, *, after: str | None = None, limit: int = 100) -> list[ImportJob]:
        """Return up to ``limit`` import jobs with id greater than ``after``, by id (oldest first)."""
        ...

    def import_job_newest(self, tenant: str, *, limit: int = 20) -> list[ImportJob]:
        """Return the ``limit`` (1..5000) most recent import jobs, newest first (O(limit))."""
        ...

    def import_data_get(self, tenant: str, job_id: str) -> str | None:
        """Return the CSV text of an import job, or ``None`` once it was released."""
        ...

    def import_data_delete(self, tenant: str, job_id: str) -> None:
        """Release the CSV text of an import job (after it finished)."""
        ...
