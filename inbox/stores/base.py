"""The contract of every inbox store (enforced by ``tests/inbox/test_store_contract.py``).

A store persists what the services already validated; it knows nothing of HTTP,
Celery or settings. Every method is tenant-scoped: another tenant's objects are
simply absent.

Rules every implementation keeps:

- ``write(tenant, change)`` is atomic: the conversation, its chat index, its
  place in every list and count, every message put or removed, every message
  id claimed and every read marker the change moves apply together or not at all.
- Each record carries a ``revision`` (the store's version). Writing a record
  expects its ``revision``: ``0`` means "must not exist yet", ``n`` means "must
  still be at revision ``n``". A failed expectation raises ``StaleRevision`` (a ``Conflict``) and
  nothing is written. The result carries the new revisions.
- A new message (revision 0) claims its id; an id already claimed by any
  message of the tenant (its own id or an alias) is a ``Conflict``. So two
  workers projecting the same message leave exactly one copy.
- A new conversation (revision 0) claims its identity (``Conversation.identity``:
  its channel and chat key, or the chat key alone for one without a channel);
  one identity maps to at most one conversation.
- A message keeps its timestamp and direction across writes (to move it,
  remove it and put a new one in the same change).
- Conversations list newest activity first (ties by identity hash); messages
  in ``(timestamp_ms, id)`` order; notes in id order (ids sort by creation
  time). Cursors are exclusive.
- Unread counts. ``Conversation.inbound_count`` is the number of the
  conversation's inbound messages (projection keeps it; the store relies on
  it). A read marker's ``seen_inbound`` is the number of inbound messages that
  sort at or before it: ``marker_put`` computes it, and a ``write`` that adds
  (or removes) an inbound message sorting at or before a marker adds one to
  (or takes one from) that marker in the same commit. An agent's unread count
  in a conversation is ``inbound_count - seen_inbound`` (``inbound_count``
  without a marker). A marker written while such a write runs makes one of the
  two retry, so neither misses the other.
- Counts (``conversation_counts``, ``unread_sum``) are exact at every instant
  and follow the *stored* status (a snoozed conversation whose time has come
  counts as pending until it is reopened).
- ``conversation_delete`` removes the conversation, its chat index and its
  list and count entries, takes its read markers out of every count and leaves
  an erasure tombstone; ``conversation_purge`` then removes messages, notes,
  events and read markers in batches and drops the tombstone when nothing is left.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

from botmesh_admin.errors import Conflict, ValidationError
from botmesh_admin.kv.base import ConflictError
from botmesh_admin.kv.cas import cas_retry
from inbox.domain import Conversation, ConversationEvent, InboxSettings, Message, Note, ReadMarker


class StaleRevision(Conflict):
    """A write's expectation failed: the record changed, or was created, since it was read (HTTP 409).

    Nothing was written. The services read again and retry
    (``cas_retry(..., retry_on=STALE)``); every other ``Conflict`` is a refusal
    the caller sees at once.
    """


T = TypeVar("T")

STALE: tuple[type[Conflict], ...] = (StaleRevision, ConflictError)
"""What an inbox compare-and-set retry runs again on: a store's revision miss (or the Kv's own)."""

BUSY_CHAT_ATTEMPTS = 50
"""The ``cas_retry`` bound of writes to one conversation (its messages, markers, status; 50 as before issue 14).

One chat's writers contend harder than ``CAS_ATTEMPTS`` (8) absorbs: every
replica's and worker's projection of a busy chat, read markers racing its
messages, an agent acting meanwhile all compare-and-set the same record; with
four workers projecting one chat 8 attempts lose records
(``tests/inbox/test_services.py``, ``tests/inbox/test_indexed_reads.py``).
"""


def chat_retry(
    attempt: Callable[[], T],
    *,
    busy: str,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] = STALE,
) -> T:
    """Return ``cas_retry(attempt)`` bounded by ``BUSY_CHAT_ATTEMPTS``, raising ``Conflict(busy)`` when exhausted.

    The one retry of the inbox's writes to a conversation and what hangs off it
    (messages, read markers, settings). ``retry_on`` is what runs the attempt
    again: ``STALE`` (a store's revision miss or the Kv's) for services, the
    Kv's ``ConflictError`` alone inside a store (its ``StaleRevision`` goes up
    to the service), or a private miss class. After the last miss it raises
    ``Conflict(busy)`` (HTTP 409) — the inbox's wording before issue 14, e.g.
    "conversation is too busy; try again".
    """
    return cas_retry(
        attempt,
        what=busy,
        retry_on=retry_on,
        attempts=BUSY_CHAT_ATTEMPTS,
        exhausted=lambda: Conflict(busy),
    )


MAX_SCAN = 5000
INVERT = 10**13 - 1
VIEWS = ("all", "mine", "unassigned")
STATUSES = ("open", "pending", "resolved")


def conversation_cursor(conversation: Conversation) -> str:
    """Return the position of a conversation in the lists (newest activity first) as a cursor.

    ``<last_activity_ms>/<conversation id>``: the same position in every list
    (any view, status or channel), so a cursor outlives a change of filter.
    """
    return f"{conversation.last_activity_ms}/{conversation.id}"


def maybe_unread(inbound: int, marker: ReadMarker | None) -> bool:
    """Return False only when ``marker`` shows all ``inbound`` messages read (or there are none).

    The pre-filter of ``InboxStore.unread_candidates``: a marker without
    ``seen_inbound`` (stored before the counts) may still hide unread messages.
    """
    if marker is None:
        return inbound > 0
    return marker.seen_inbound is None or marker.seen_inbound < inbound


def unread_candidates_by_page(
    store: InboxStore,
    tenant: str,
    *,
    agent: str,
    view: str,
    status: str | None,
    channel: str | None,
    after: str | None,
    limit: int,
) -> tuple[list[tuple[Conversation, ReadMarker | None]], str | None, int]:
    """``InboxStore.unread_candidates`` from a ``conversation_page`` and the agent's markers (records all read)."""
    page, cursor = store.conversation_page(
        tenant, view=view, agent=agent, status=status, channel=channel, after=after, limit=limit
    )
    markers = store.markers_get(tenant, [c.id for c in page], agent)
    pairs = [(c, m) for c, m in zip(page, markers, strict=True) if maybe_unread(c.inbound_count, m)]
    return pairs, cursor, len(page)


def parse_cursor(after: str) -> tuple[int, str]:
    """Return ``(last_activity_ms, conversation id)`` of a ``conversation_cursor``.

    Raise ``ValidationError`` (field ``after``) for anything else.
    """
    ms, _, conversation_id = after.partition("/")
    if not ms.isascii() or not ms.isdigit() or len(ms) > 16 or not conversation_id:
        raise ValidationError("after", "not a cursor of this list")
    return int(ms), conversation_id


@dataclass(frozen=True)
class Change:
    """One atomic write of a conversation and its messages.

    ``conversation``: put, expecting its ``revision`` (0: new; claims its chat key).
    ``messages``: put, each expecting its ``revision`` (0: new; claims its id).
    ``removed``: delete, each expecting its ``revision`` (releases its id and aliases).
    ``aliases``: ``(id, message)`` pairs — claim another id for a message (the same
    message seen under a ledger id and a webhook id).
    ``previous``: the conversation as read at ``conversation.revision`` (lets a
    store move its list and count entries without reading it again; without it
    a store reads it).
    ``events``: added to the conversation's history (``event_page``), each a new id.
    """

    conversation: Conversation | None = None
    messages: tuple[Message, ...] = ()
    removed: tuple[Message, ...] = ()
    aliases: tuple[tuple[str, Message], ...] = ()
    previous: Conversation | None = None
    events: tuple[ConversationEvent, ...] = ()


@runtime_checkable
class InboxStore(Protocol):
    """Conversations, messages, notes and read markers of every tenant."""

    def conversation_get(self, tenant: str, conversation_id: str) -> Conversation | None:
        """Return the conversation ``conversation_id``, or ``None``."""
        ...

    def conversation_by_chat(
        self, tenant: str, chat_key: str, *, channel_name: str | None = None
    ) -> Conversation | None:
        """Return the conversation of ``chat_key`` on the channel ``channel_name``, or ``None``.

        The one stored under ``(channel_name, chat_key)``; else the one stored
        under the chat key alone if it has no channel or that channel (a
        conversation from before conversations belonged to a channel).
        ``channel_name`` ``None``: the one stored under the chat key alone.
        """
        ...

    def conversation_page(
        self,
        tenant: str,
        *,
        view: str = "all",
        agent: str | None = None,
        status: str | None = None,
        channel: str | None = None,
        after: str | None = None,
        limit: int = 50,
        channel_name: str | None = None,
        contact_id: str | None = None,
    ) -> tuple[list[Conversation], str | None]:
        """Return up to ``limit`` conversations, newest ``last_activity_ms`` first, and the cursor.

        ``view``: ``all``, ``mine`` (assigned to ``agent``) or ``unassigned``;
        ``status``: the stored status; ``channel``: the conversation's channel
        kind; ``channel_name``: the channel configuration that received it;
        ``contact_id``: the CRM contact linked to it (with it, a store may
        return conversations the other filters exclude: callers check).
        Read O(limit) records. ``after`` is a ``conversation_cursor`` (the
        previous page's cursor); the cursor returned is ``None`` when there are
        no more conversations. A conversation that changed while the page was
        read may no longer match the filters (callers check).
        """
        ...

    def unread_candidates(
        self,
        tenant: str,
        *,
        agent: str,
        view: str = "all",
        status: str | None = None,
        channel: str | None = None,
        after: str | None = None,
        limit: int = 50,
    ) -> tuple[list[tuple[Conversation, ReadMarker | None]], str | None, int]:
        """Examine the next ``limit`` conversations of a list; return those ``agent`` may have unread.

        The list is ``conversation_page``'s for ``view`` / ``status`` /
        ``channel``. Returned: ``(rows, cursor, examined)`` — each row a
        conversation with ``agent``'s read marker in it (or ``None``), in list
        order; the cursor after the last conversation examined (``None`` at the
        end of the list); and how many were examined. A store may leave out
        only conversations in which ``agent`` has no unread inbound message (a
        pre-filter: callers compute unread exactly), so it need not read the
        records of the ones it skips. O(limit).
        """
        ...

    def conversation_counts(self, tenant: str, *, agent: str) -> dict[str, dict[str, int]]:
        """Return ``{view: {status: conversations}}`` for the three views of ``agent`` (O(1), exact)."""
        ...

    def unread_sum(self, tenant: str, *, agent: str, view: str = "all") -> int | None:
        """Return ``agent``'s unread inbound messages over every conversation of ``view`` (O(1), exact).

        ``None`` while the tenant still has read markers stored before the
        store kept ``seen_inbound`` (the caller counts by walking, then).
        """
        ...

    def snoozed_due(self, tenant: str, *, now_ms: int, limit: int = 200) -> list[Conversation]:
        """Return up to ``limit`` pending conversations snoozed until ``now_ms`` or earlier, soonest first."""
        ...

    def markers_backfill(self, tenant: str, *, limit: int = 200) -> int:
        """Give up to ``limit`` read markers stored without ``seen_inbound`` their exact count.

        Also removes what older versions of the store kept that it no longer
        uses. Return how many records were changed; 0 means nothing is left.
        """
        ...

    def message_get(self, tenant: str, message_id: str) -> Message | None:
        """Return the message with ``message_id`` (its own id or an alias), or ``None``."""
        ...

    def message_by_provider_id(self, tenant: str, provider_message_id: str) -> Message | None:
        """Return the message whose ``provider_message_id`` is given, or ``None``."""
        ...

    def message_page(
        self, tenant: str, conversation_id: str, *, after: str | None = None, limit: int = 100
    ) -> list[Message]:
        """Return up to ``limit`` messages of a conversation in order, after sort key ``after``."""
        ...

    def write(self, tenant: str, change: Change) -> Change:
        """Apply ``change`` atomically; return it with every record at its new revision.

        Raise ``Conflict`` (nothing written) if an expectation fails or a new
        message's id or a new conversation's chat key is already claimed.
        """
        ...

    def note_add(self, tenant: str, note: Note) -> Note:
        """Store a new note; raise ``Conflict`` if its id exists, ``NotFound`` if its conversation does not."""
        ...

    def note_page(self, tenant: str, conversation_id: str, *, after: str | None = None, limit: int = 50) -> list[Note]:
        """Return up to ``limit`` notes of a conversation in id order, ids after ``after``."""
        ...

    def conversation_search_scan(
        self, tenant: str, prefix: str, *, after: tuple[str, str] | None = None, limit: int = 200
    ) -> list[tuple[str, Conversation]]:
        """Return ``(search key, conversation)`` for each key starting with ``prefix``, in key order.

        The keys are ``conversation_search_keys`` of each conversation (one
        conversation may come once per matching key); ``after`` is the
        ``(key, conversation id)`` of the last item of the previous call
        (exclusive). Reads O(limit) entries.
        """
        ...

    def event_page(
        self, tenant: str, conversation_id: str, *, after: str | None = None, limit: int = 50
    ) -> list[ConversationEvent]:
        """Return the conversation's events in id (time) order after the id ``after`` (exclusive)."""
        ...

    def marker_get(self, tenant: str, conversation_id: str, agent: str) -> ReadMarker | None:
        """Return ``agent``'s read marker in a conversation, or ``None``."""
        ...

    def markers_get(self, tenant: str, conversation_ids: list[str], agent: str) -> list[ReadMarker | None]:
        """Return ``agent``'s read marker (or ``None``) in each conversation, in order (one read)."""
        ...

    def marker_put(self, tenant: str, marker: ReadMarker) -> ReadMarker:
        """Store a read marker expecting its ``revision`` (0: new); return it at the new revision.

        The store computes ``seen_inbound`` (the marker's ``seen_inbound`` is
        ignored), reading the messages between the old and the new position or
        after the new one, whichever ends first. Raise ``Conflict`` on a stale
        revision and ``NotFound`` if the conversation is gone.
        """
        ...

    def conversation_delete(self, tenant: str, conversation: Conversation) -> None:
        """Delete the conversation (expecting its revision) and leave an erasure tombstone.

        Raise ``Conflict`` if it changed, ``NotFound`` if it is gone.
        """
        ...

    def erasure_pending(self, tenant: str, conversation_id: str) -> bool:
        """Return True if ``conversation_id`` was deleted and its purge is not finished."""
        ...

    def conversation_purge(self, tenant: str, conversation_id: str, *, limit: int = 500) -> int:
        """Remove up to ``limit`` messages, notes and markers of a deleted conversation.

        Return how many records were removed; 0 means the purge is complete and
        the tombstone is gone.
        """
        ...

    def settings_get(self, tenant: str) -> InboxSettings:
        """Return the tenant's inbox settings (the defaults, at revision 0, if never stored)."""
        ...

    def settings_put(self, tenant: str, settings: InboxSettings) -> InboxSettings:
        """Store the settings expecting their ``revision`` (0: never stored); return them at the new one.

        Raise ``Conflict`` on a stale revision.
        """
        ...
