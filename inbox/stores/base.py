"""The contract of every inbox store (enforced by ``tests/inbox/test_store_contract.py``).

A store persists what the services already validated; it knows nothing of HTTP,
Celery or settings. Every method is tenant-scoped: another tenant's objects are
simply absent.

Rules every implementation keeps:

- ``write(tenant, change)`` is atomic: the conversation, its chat index, its
  place in the activity order, every message put or removed and every message
  id claimed apply together or not at all.
- Each record carries a ``revision`` (the store's version). Writing a record
  expects its ``revision``: ``0`` means "must not exist yet", ``n`` means "must
  still be at revision ``n``". A failed expectation raises ``Conflict`` and
  nothing is written. The result carries the new revisions.
- A new message (revision 0) claims its id; an id already claimed by any
  message of the tenant (its own id or an alias) is a ``Conflict``. So two
  workers projecting the same message leave exactly one copy.
- A new conversation (revision 0) claims its chat key; one chat key maps to at
  most one conversation.
- A message keeps its timestamp across writes (to move it, remove it and put a
  new one in the same change).
- Conversations list newest activity first; messages in ``(timestamp_ms, id)``
  order; notes in id order (ids sort by creation time). Cursors are exclusive.
- ``conversation_delete`` removes the conversation, its chat index and its
  activity entry and leaves an erasure tombstone; ``conversation_purge`` then
  removes messages, notes and read markers in batches and drops the tombstone
  when nothing is left.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from inbox.domain import Conversation, Message, Note, ReadMarker

MAX_SCAN = 5000
INVERT = 10**13 - 1


def activity_cursor(conversation: Conversation) -> str:
    """Return the position of a conversation in the activity order (newest first) as a cursor."""
    return f"a/{INVERT - conversation.last_activity_ms:013d}/{conversation.id}"


@dataclass(frozen=True)
class Change:
    """One atomic write of a conversation and its messages.

    ``conversation``: put, expecting its ``revision`` (0: new; claims its chat key).
    ``messages``: put, each expecting its ``revision`` (0: new; claims its id).
    ``removed``: delete, each expecting its ``revision`` (releases its id and aliases).
    ``aliases``: ``(id, message)`` pairs — claim another id for a message (the same
    message seen under a ledger id and a webhook id).
    ``previous_activity_ms``: the ``last_activity_ms`` of the conversation as read at
    its ``revision`` (lets a store move its activity entry without reading it again).
    """

    conversation: Conversation | None = None
    messages: tuple[Message, ...] = ()
    removed: tuple[Message, ...] = ()
    aliases: tuple[tuple[str, Message], ...] = ()
    previous_activity_ms: int | None = None


@runtime_checkable
class InboxStore(Protocol):
    """Conversations, messages, notes and read markers of every tenant."""

    def conversation_get(self, tenant: str, conversation_id: str) -> Conversation | None:
        """Return the conversation ``conversation_id``, or ``None``."""
        ...

    def conversation_by_chat(self, tenant: str, chat_key: str) -> Conversation | None:
        """Return the conversation of ``chat_key``, or ``None``."""
        ...

    def conversation_page(
        self, tenant: str, *, after: str | None = None, limit: int = 50
    ) -> tuple[list[Conversation], str | None]:
        """Return up to ``limit`` conversations, newest ``last_activity_ms`` first, and the cursor.

        ``after`` is the cursor returned by the previous page (opaque); the
        cursor returned is ``None`` when there are no more conversations.
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

    def note_page(
        self, tenant: str, conversation_id: str, *, after: str | None = None, limit: int = 50
    ) -> list[Note]:
        """Return up to ``limit`` notes of a conversation in id order, ids after ``after``."""
        ...

    def marker_get(self, tenant: str, conversation_id: str, agent: str) -> ReadMarker | None:
        """Return ``agent``'s read marker in a conversation, or ``None``."""
        ...

    def marker_put(self, tenant: str, marker: ReadMarker) -> ReadMarker:
        """Store a read marker expecting its ``revision`` (0: new); return it at the new revision.

        Raise ``Conflict`` on a stale revision and ``NotFound`` if the conversation is gone.
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
