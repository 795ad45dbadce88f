"""The inbox store over any DurableKv (ARCHITECTURE §4), through ``TenantKv(kv, "inbox")``.

One table per tenant, ``inbox/<tenant>/conversations``, because a Kv commit is
atomic inside one table only and a projection must write a message, its id
claim, its conversation and the conversation's index entries together. Keys:

=====================================  ===================================================
``k/<sha256(identity)[:32]>``          the conversation (its Kv version is ``revision``); the
                                       identity is ``<channel name>|<chat key>``, the chat key
                                       alone for one stored without a channel
``c/<conversation id>``                ``{"k": chat hash}`` — finds a conversation by id
``m/<conv id>/<13 digit ms>/<msg id>`` a message (ordered by timestamp, then id)
``i/<message id or alias>``            ``{"c": conv id, "k": sort key}`` — id claims
``p/<provider message id>``            ``{"c": conv id, "k": sort key}``
``n/<conv id>/<note id>``              a note
``v/<conv id>/<event id>``             an event of its history (assigned, handoff, status)
``r/<conv id>/<agent>``                a read marker, with ``seen_inbound`` and the
                                       conversation's ``assignee`` (a copy, for the counts)
``r/<conv id>/#``                      a counter every marker write of the conversation
                                       adds to (``#`` is no agent's name; see below)
``e/<conv id>``                        an erasure tombstone while a purge runs
``x/...``                              the indexes below (``botmesh_admin.kv.indexes``)
=====================================  ===================================================

Indexes (declared once, kept in the record's own commit by the kernel):

- ``conv_list`` (value) — every conversation twice, newest activity first:
  ``("-", -last_activity_ms)`` (all) and ``("a", assignee, -ms)`` (mine: an
  agent; unassigned: ``None``). Entries hold the position (``at``, ``id``)
  and, from generation 2, ``n`` (the inbound count), so an unread-only list
  skips from the entries alone what an agent has read
  (``unread_candidates``). Each view's list is one scan. Generation 3 dropped
  the ``("sc", status, channel)`` and ``("asc", …)`` entries that generations
  1 and 2 kept (``conv_channel`` serves those filters): the older tables stay
  readable and ``botmesh_reindex`` upgrades them in place, sweeping those.
  Every projected message moves each entry that holds its activity, so the
  fewer the better: this list is on the hottest write path.
- ``conv_channel`` (value) — every conversation twice by the channel
  that received it: ``("sn", status, channel, channel_name, -ms)`` and
  ``("asn", assignee, status, channel, channel_name, -ms)``. A status,
  channel kind or channel name filter merges the scans of the prefixes it
  leaves open — the three statuses (none given) × the tenant's ``(kind,
  name)`` pairs (those of the kind or name given; ``conv_names``) — into one
  page, so a page reads at most ``3 × pairs × (limit + 1)`` index entries,
  then one ``get_many`` of its records. Generation 2 (with ``conv_list``'s
  generation 3) adds the kind to the key: a chat stored without a channel
  name has a kind all the same. ``botmesh_reindex`` rebuilds it on tables
  written before; until then a filtered list names that command.
- ``conv_names`` (count) — conversations per ``(channel, channel_name)``:
  the pairs a filtered list merges (a tenant has a handful). New with
  ``conv_channel``'s generation 2, built by ``botmesh_reindex`` likewise.
- ``conv_contact`` (value) — every conversation linked to a CRM contact once,
  ``(contact_id,)`` then the record key, no payload: the list of one
  contact's conversations (the CRM contact page's link) reads them all (one
  per chat and channel, at most ``CONTACT_CONVERSATIONS``) and orders them by
  activity; the selector applies the other filters to what it reads. Nothing
  in an entry moves with activity, so a projected message writes none.
  (Generation 2; generation 1 keyed ``(contact_id, -ms)`` with a position
  payload: ``botmesh_reindex`` rebuilds it, ``./dev run`` runs it at start.)
- ``conv_text`` (value) — every conversation once per search key
  (``conversation_search_keys``: contact name words, phone digits, Telegram
  id), ordered by key, no payload: text search by prefix reads O(page)
  entries, and a message (which changes neither the name nor the chat)
  writes none. (Generation 2: generation 1 copied the position into each.)
- ``conv_snoozed`` (value) — pending conversations by ``snoozed_until_ms``
  (the wake-up job).
- ``conv_count`` (count) — conversations per ``("*", status)``,
  ``("a", assignee, status)`` and ``("c", channel)`` (per channel kind).
- ``conv_inbound`` (count) — ``inbound_count`` summed per ``("*",)`` and
  ``("a", assignee)``.
- ``marker_seen`` (count) — ``seen_inbound`` summed per ``("*", agent)`` and
  ``("a", agent, assignee)``, so unread = inbound sum − seen sum, per view.
- ``marker_legacy`` (value) — markers stored before ``seen_inbound`` existed,
  until ``markers_backfill`` counts them.

Each index declares the fields it ``reads``: a change that leaves them equal
skips its upkeep without computing entries (``botmesh_admin.kv.indexes``).

Read markers and the writes that move them. A write that adds an inbound
message to a conversation reads its markers (one scan of ``r/<conv id>/``)
and adds one to ``seen_inbound`` of each marker the message sorts at or
before; a marker written meanwhile would be missed, so every marker write adds
to ``r/<conv id>/#`` (which the same scan returns) and such a write expects
that counter's version: one of the two retries. A marker write expects the
conversation's revision, so it recounts when a message arrived while it
counted. Erasing a conversation deletes the counter and marks its markers
``erased`` (out of every count) for the purge to remove.

Chat keys are hashed in keys, so raw chat ids are never part of a key (and a
list cursor names the conversation id, not the hash). The conversation sits
under its chat key because projection (the hot path) looks it up by chat: one
read; a lookup by id reads the pointer first. Older versions kept a copy of
each conversation under ``a/<inverted activity>/<conv id>``; erasure deletes
it and ``markers_backfill`` removes the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from botmesh_admin.errors import Conflict, NotFound
from botmesh_admin.kv import (
    ABSENT,
    ANY,
    Add,
    Check,
    ConflictError,
    Delete,
    DurableKv,
    Op,
    Put,
    TenantKv,
)
from botmesh_admin.kv.base import Entry, JsonValue
from botmesh_admin.kv.buffered import BufferedKv
from botmesh_admin.kv.cas import CONTENDED_ATTEMPTS, cas_retry
from botmesh_admin.kv.indexes import (
    CountIndex,
    IndexedTable,
    RecordChange,
    RecordType,
    ValueIndex,
    declare,
    decode,
    encode,
    encode_component,
)
from botmesh_admin.kv.validation import MAX_GET_MANY
from botmesh_admin.pagination import page_of, validate_limit
from inbox.domain import (
    Conversation,
    ConversationEvent,
    InboxSettings,
    Message,
    Note,
    ReadMarker,
    chat_hash,
    conversation_identity,
    conversation_search_keys,
    now_ms,
    replace,
)

from .base import (
    INVERT,
    MAX_SCAN,
    STATUSES,
    Change,
    StaleRevision,
    chat_retry,
    maybe_unread,
    parse_cursor,
    unread_candidates_by_page,
)

COLLECTION = "conversations"
TEXT_BASE = "x/conv_text/"
SETTINGS, SETTINGS_KEY = "settings", "inbox"
MESSAGE_BATCH = 500
CONTACT_CONVERSATIONS = 1000
"""The most conversations of one contact a list shows (one per chat and channel: a handful in practice)."""
PURGE_ATTEMPTS = 1000  # an erasure's purge never gave up before issue 14 (a chat busy meanwhile): ≤ ~50 s of pauses
FILTERS = ("assignee", "status", "channel")


def activity_key(conversation_id: str, last_activity_ms: int) -> str:
    """Return the key of the activity copy older versions kept (erasure deletes it)."""
    return f"a/{INVERT - last_activity_ms:013d}/{conversation_id}"


POINTER_VERSION = 1
"""The version of every ``c/<conversation id>`` pointer: written once, deleted with its conversation."""


def same_incarnation(conversation_id: str) -> Check:
    """Return a ``Check`` that the conversation ``conversation_id`` still exists.

    ``k/<chat hash>`` keys are reused (after an erasure the chat starts a new
    conversation under the same key, whose versions restart at 1), but
    conversation ids never are: a write that expects the version it read of
    conversation A also checks A's pointer, so it cannot land on a newer
    conversation B at the same version. That is what lets the record types
    below declare ``reuses_keys=False`` (the kernel trusts the ``old`` values
    given and reads nothing before committing).
    """
    return Check(f"c/{conversation_id}", POINTER_VERSION)


def conversation_of_key(key: str) -> str | None:
    """Return the id of the conversation a key of the table belongs to (``None``: none named in it).

    ``m/``, ``n/``, ``v/``, ``r/`` keys name it first, ``c/`` and ``e/`` keys
    are it; a ``k/`` key is written with its ``c/`` pointer (a check or a put),
    ``i/`` and ``p/`` claims with their message. ``BufferedKv.flush`` groups a
    batch's commits by it: one commit per conversation.
    """
    kind, _, rest = key.partition("/")
    if kind in ("m", "n", "v", "r"):
        return rest.partition("/")[0] or None
    if kind in ("c", "e"):
        return rest or None
    return None


def _stale(what: str, exc: ConflictError) -> StaleRevision:
    return StaleRevision(f"{what} changed concurrently", current_version=exc.current_version, key=exc.key)


# -- the declared indexes ---------------------------------------------------------------


def _list_keys(record: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    at = -int(record.get("last_activity_ms") or 0)
    return [("-", at), ("a", record.get("assignee"), at)]


def _channel_keys(record: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    at = -int(record.get("last_activity_ms") or 0)
    assignee, status, channel = (record.get(name) for name in FILTERS)
    name = record.get("channel_name")
    return [("sn", status, channel, name, at), ("asn", assignee, status, channel, name, at)]


def _contact_keys(record: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    contact_id = record.get("contact_id")
    return [(contact_id,)] if contact_id else []


def _text_keys(record: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    chat_key = record.get("chat_key")
    if not chat_key:
        return []
    return [(k,) for k in sorted(conversation_search_keys(record.get("display_name"), str(chat_key)))]


INDEXED = (
    "id",
    "chat_key",
    "display_name",
    "assignee",
    "status",
    "channel",
    "channel_name",
    "last_activity_ms",
    "inbound_count",
    "snoozed_until_ms",
    "contact_id",
)
"""The conversation fields its indexes read (``_indexed`` gives the indexes only these)."""


def _indexed(value: JsonValue) -> Mapping[str, Any]:
    """Return the fields of a stored conversation its indexes read."""
    return {name: value.get(name) for name in INDEXED}


def _indexed_of(conversation: Conversation) -> dict[str, Any]:
    """Return ``_indexed(conversation.to_json())`` without building the whole JSON (the hot path)."""
    return {name: getattr(conversation, name) for name in INDEXED}


POSITION = ("last_activity_ms", "id")
"""The fields of a list position (``_position``): what orders a conversation in a list."""


def _position(record: Mapping[str, Any]) -> dict[str, JsonValue]:
    return {"at": int(record.get("last_activity_ms") or 0), "id": record["id"]}


def _list_entry(record: Mapping[str, Any]) -> dict[str, JsonValue]:
    """Return a ``conv_list`` entry's payload: the position and ``n``, the inbound message count."""
    return {**_position(record), "n": int(record.get("inbound_count") or 0)}


MARKER_GUARD = "#"  # the last path part of the markers' counter (AGENT_RE never allows it)


def _marker_view(value: JsonValue) -> Mapping[str, Any]:
    """Return a marker for the indexes (the markers' counter, an integer, is no marker)."""
    return value if isinstance(value, Mapping) else {}


def _counted_marker(record: Mapping[str, Any]) -> bool:
    return record.get("seen_inbound") is not None and not record.get("erased")


def _legacy_marker(record: Mapping[str, Any]) -> bool:
    return "agent" in record and record.get("seen_inbound") is None and not record.get("erased")


CONVERSATION = RecordType(
    "conversation",
    "k/",
    (
        # Generation 2 added the inbound count to each entry (an unread-only list skips, from the entries
        # alone, what an agent has read); generation 3 drops the status × channel entries (conv_channel
        # serves those filters). Generations 1 and 2 hold the same "-" and "a" entries, so they stay
        # readable and botmesh_reindex upgrades them in place (the dropped entries swept).
        ValueIndex(
            "conv_list",
            keys=_list_keys,
            payload=_list_entry,
            reads=("assignee", *POSITION, "inbound_count"),
            generation=3,
            readable_from=1,
        ),
        # Generation 2 keys by the channel kind too (a name, or no name, is no kind): it serves every
        # status and channel filter since conv_list's generation 3.
        ValueIndex(
            "conv_channel",
            keys=_channel_keys,
            payload=_position,
            reads=(*FILTERS, "channel_name", *POSITION),
            generation=2,
        ),
        # Generation 2: keyed by the contact alone, no payload (a message moved both entries before).
        ValueIndex("conv_contact", keys=_contact_keys, reads=("contact_id",), generation=2),
        # Generation 2: no payload (generation 1 copied the position, which no search read, into
        # every entry: a projected message rewrote each of its search keys).
        ValueIndex("conv_text", keys=_text_keys, reads=("display_name", "chat_key"), generation=2),
        ValueIndex(
            "conv_snoozed",
            ("snoozed_until_ms",),
            where=lambda r: r.get("status") == "pending" and r.get("snoozed_until_ms") is not None,
            reads=("status", "snoozed_until_ms"),
        ),
        CountIndex(
            "conv_count",
            keys=lambda r: [
                ("*", r.get("status")),
                ("a", r.get("assignee"), r.get("status")),
                ("c", r.get("channel")),
            ],
            reads=FILTERS,
        ),
        CountIndex(
            "conv_names",
            keys=lambda r: [(r.get("channel"), r.get("channel_name"))],
            reads=("channel", "channel_name"),
        ),
        CountIndex(
            "conv_inbound",
            keys=lambda r: [("*",), ("a", r.get("assignee"))],
            amount=lambda r: int(r.get("inbound_count") or 0),
            reads=("assignee", "inbound_count"),
        ),
    ),
    decode=_indexed,
    reuses_keys=False,  # see same_incarnation
)
MARKER = RecordType(
    "read_marker",
    "r/",
    (
        CountIndex(
            "marker_seen",
            keys=lambda r: [("*", r.get("agent")), ("a", r.get("agent"), r.get("assignee"))],
            where=_counted_marker,
            amount=lambda r: int(r["seen_inbound"]),
            reads=("agent", "assignee", "seen_inbound", "erased"),
        ),
        ValueIndex("marker_legacy", (), where=_legacy_marker, reads=("agent", "seen_inbound", "erased")),
    ),
    decode=_marker_view,
    reuses_keys=False,  # a marker's key names its conversation's id, which is never reused
)
CONVERSATIONS = declare("inbox", COLLECTION, [CONVERSATION, MARKER])


def _marker_json(marker: ReadMarker, seen: int, assignee: str | None) -> dict[str, Any]:
    return dict(marker.to_json(), seen_inbound=seen, assignee=assignee)


def _view_group(view: str, agent: str | None) -> tuple[Any, ...]:
    """Return the group of a view in the count indexes (``("*",)``, or ``("a", assignee)``)."""
    if view == "all":
        return ("*",)
    return ("a", agent if view == "mine" else None)


class KvInboxStore:
    """``InboxStore`` over a DurableKv; safe across threads and processes."""

    def __init__(self, kv: DurableKv) -> None:
        self.kv = kv
        self.tables = TenantKv(kv, "inbox")
        self.layout: IndexedTable = CONVERSATIONS.layout(kv)

    def _table(self, tenant: str) -> str:
        return self.tables.table(tenant, COLLECTION)

    def buffered(self) -> KvInboxStore:
        """Return this store over a ``BufferedKv`` of its Kv: writes held until ``store.kv.flush(...)``.

        What a projection batch runs against (``inbox.services.projection.project_batched``).
        """
        return KvInboxStore(BufferedKv(self.kv))

    def prefetch(self, tenant: str, *, chats: list[tuple[str, str | None]], message_ids: list[str]) -> None:
        """Read now what projecting these chats and message ids will read: two ``get_many`` and the markers.

        ``chats``: ``(chat key, channel name)``; ``message_ids``: message ids
        and provider ids (both claims and provider pointers are read, then the
        messages they point to). The read markers of the conversations found
        (which an inbound message moves) are read with one merged scan per 64
        conversations (``BufferedKv.prefetch_scans``) instead of one scan each.
        Only a buffered store keeps what it read.
        """
        if not isinstance(self.kv, BufferedKv):
            return
        table = self._table(tenant)
        keys = []
        for chat_key, channel_name in chats:
            keys.append(f"k/{chat_hash(chat_key)}")
            if channel_name is not None:
                keys.append(f"k/{chat_hash(conversation_identity(chat_key, channel_name))}")
        pointers = [key for m in dict.fromkeys(message_ids) for key in (f"i/{m}", f"p/{m}")]
        self.kv.prefetch(table, keys + pointers)
        found = [e for e in self.kv.get_many(table, pointers) if e is not None and isinstance(e.value, dict)]
        self.kv.prefetch(table, sorted({f"m/{e.value['c']}/{e.value['k']}" for e in found}))
        conversations = [e for e in self.kv.get_many(table, keys) if e is not None and isinstance(e.value, dict)]
        ids = sorted({str(e.value["id"]) for e in conversations if e.value.get("id")})
        self.kv.prefetch_scans(table, [f"r/{conversation_id}/" for conversation_id in ids], MAX_SCAN)

    # -- conversations ----------------------------------------------------------

    def _conversation_key(self, table: str, conversation_id: str) -> str | None:
        pointer = self.kv.get(table, f"c/{conversation_id}")
        return None if pointer is None else f"k/{pointer.value['k']}"

    def conversation_get(self, tenant: str, conversation_id: str) -> Conversation | None:
        table = self._table(tenant)
        key = self._conversation_key(table, conversation_id)
        entry = None if key is None else self.kv.get(table, key)
        if entry is None or entry.value.get("id") != conversation_id:
            return None
        return Conversation.from_json(entry.value, entry.version)

    def conversation_by_chat(
        self, tenant: str, chat_key: str, *, channel_name: str | None = None
    ) -> Conversation | None:
        table = self._table(tenant)
        legacy_key = f"k/{chat_hash(chat_key)}"
        if channel_name is None:
            entry = self.kv.get(table, legacy_key)
            return None if entry is None else Conversation.from_json(entry.value, entry.version)
        # One round trip for both places (the chat on this channel; a chat stored before channels).
        own, legacy = self.kv.get_many(
            table, [f"k/{chat_hash(conversation_identity(chat_key, channel_name))}", legacy_key]
        )
        if own is not None:
            return Conversation.from_json(own.value, own.version)
        if legacy is None or legacy.value.get("channel_name") not in (None, channel_name):
            return None
        return Conversation.from_json(legacy.value, legacy.version)

    def _list_ranges(
        self,
        table: str,
        view: str,
        agent: str | None,
        status: str | None,
        channel: str | None,
        channel_name: str | None = None,
    ) -> tuple[str, list[list[Any]]]:
        """Return the index and the value prefixes whose merge is the list of these filters.

        A view alone is one ``conv_list`` range. A status, a channel kind or a
        channel name reads ``conv_channel``: one range per status (the one
        given, else all three) and ``(kind, name)`` of the tenant's
        conversations (``conv_names``: of the kind and the name given, if any).
        """
        who: list[Any] = [] if view == "all" else [agent if view == "mine" else None]
        if status is None and channel is None and channel_name is None:
            return "conv_list", [["a", *who] if who else ["-"]]
        tag = "asn" if who else "sn"
        statuses = [status] if status is not None else list(STATUSES)
        channels = [
            (kind, name)
            for kind, name in self._channels(table, channel)
            if channel_name is None or name == channel_name
        ]
        return "conv_channel", [[tag, *who, s, kind, name] for s in statuses for kind, name in channels]

    def _channels(self, table: str, channel: str | None) -> list[tuple[str, str | None]]:
        """Return ``(kind, channel name)`` of the tenant's conversations (name ``None``: stored without one).

        Of kind ``channel`` only, unless ``None``; one read of ``conv_names``.
        """
        prefix = [] if channel is None else [channel]
        counts = self.layout.count_prefix(table, "conv_names", prefix)
        found: set[tuple[str, str | None]] = set()
        for group, n in counts.items():
            if n > 0:
                pair: list[object] = [*prefix, *decode(group)]
                kind, name = pair
                found.add((str(kind), None if name is None else str(name)))
        return sorted(found, key=lambda c: (c[0], c[1] is not None, c[1] or ""))

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
        validate_limit(limit, maximum=MAX_SCAN)
        table = self._table(tenant)
        if contact_id is not None:  # one contact's few conversations: the selector filters the rest
            return self._contact_page(table, contact_id, after, limit)
        position = ""
        if after is not None:
            at, conversation_id = parse_cursor(after)
            # Resume right after that conversation's entry; if it is gone, at the start of its
            # millisecond (a row may show twice, none is skipped).
            position = encode_component(-at) + (self._conversation_key(table, conversation_id) or "")
        merged: list[tuple[str, Entry]] = []
        index, prefixes = self._list_ranges(table, view, agent, status, channel, channel_name)

        def cursor(row: tuple[Entry, Entry | None]) -> str:
            return f"{row[0].value['at']}/{row[0].value['id']}"

        if not prefixes:  # no conversation on any channel yet
            return [], None
        if limit < MAX_GET_MANY:
            # Every prefix orders its entries by the same suffix (-activity, record key): one merged
            # page with its records, one round trip where the Kv merges (SQLite, PostgreSQL, Redis).
            if len(prefixes) == 1:
                start = f"x/{index}/" + encode(prefixes[0]) + position if position else None
                rows = self.layout.scan_fetch(table, index, prefixes[0], after=start, limit=limit + 1)
            else:
                rows = self.layout.scan_merge_fetch(table, index, prefixes, after=position or None, limit=limit + 1)
            listed = page_of(rows, limit, cursor)
            return [Conversation.from_json(r.value, r.version) for _, r in listed.items if r is not None], listed.next
        # A page larger than one get_many: each range scanned, merged here, the records fetched in chunks.
        for values in prefixes:
            prefix = f"x/{index}/" + encode(values)
            page = self.layout.scan(
                table, index, values, after=prefix + position if position else None, limit=limit + 1
            )
            merged += [(e.key[len(prefix) :], e) for e in page]
        merged.sort(key=lambda item: item[0])
        listed_entries = page_of([e for _, e in merged], limit, lambda e: f"{e.value['at']}/{e.value['id']}")
        fetched = self.layout.fetch(table, listed_entries.items)
        return [Conversation.from_json(e.value, e.version) for e in fetched if e is not None], listed_entries.next

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
        """``InboxStore.unread_candidates``: the list's index entries, the agent's markers, then kept records.

        A list of one ``conv_list`` range (a view, no status or channel filter)
        reads ``limit + 1`` entries, the markers of ``limit`` conversations (one
        ``get_many``) and the records of those the entries' ``n`` (inbound
        count) does not show read (one ``get_many``): an unread-only page
        decodes only the conversations it may show. Entries of generation 1
        (no ``n``) and merged ranges read every record, as ``conversation_page``.
        """
        validate_limit(limit, maximum=MAX_GET_MANY - 1)
        table = self._table(tenant)
        index, prefixes = self._list_ranges(table, view, agent, status, channel)
        if len(prefixes) != 1:
            return unread_candidates_by_page(
                self, tenant, agent=agent, view=view, status=status, channel=channel, after=after, limit=limit
            )
        start = None
        if after is not None:
            at, conversation_id = parse_cursor(after)
            start = f"x/{index}/" + encode(prefixes[0]) + encode_component(-at)
            start += self._conversation_key(table, conversation_id) or ""
        entries = self.layout.scan(table, index, prefixes[0], after=start, limit=limit + 1)
        examined = entries[:limit]
        markers = self.markers_get(tenant, [str(e.value["id"]) for e in examined], agent)
        kept = [
            (e, m)
            for e, m in zip(examined, markers, strict=True)
            if not isinstance(n := e.value.get("n"), int) or maybe_unread(n, m)
        ]
        records = self.layout.fetch(table, [e for e, _ in kept])
        pairs = [(Conversation.from_json(r.value, r.version), m) for (_, m), r in zip(kept, records, strict=True) if r]
        last = examined[-1].value if examined else None
        cursor = f"{last['at']}/{last['id']}" if last is not None and len(entries) > limit else None
        return pairs, cursor, len(examined)

    def _contact_page(
        self, table: str, contact_id: str, after: str | None, limit: int
    ) -> tuple[list[Conversation], str | None]:
        """Return a page of one contact's conversations, newest activity first (``conversation_page``).

        The ``conv_contact`` entries of a contact are ordered by record key, not
        activity (so a message moves none of them): the contact's conversations
        (one per channel that chat reached, a handful) are read at once, up to
        ``CONTACT_CONVERSATIONS``, and ordered here as every list is: by
        ``-activity``, then the record key.
        """
        rows = self.layout.scan_fetch(table, "conv_contact", [contact_id], limit=CONTACT_CONVERSATIONS)
        # The order of every list: -activity, then the record key (see conversation_page's merge).
        found = sorted(
            ((-int(r.value.get("last_activity_ms") or 0), r.key), Conversation.from_json(r.value, r.version))
            for _, r in rows
            if r is not None
        )
        if after is not None:
            at, conversation_id = parse_cursor(after)
            # A conversation gone since: resume at the start of its millisecond (as conversation_page).
            key = next((k for (_, k), c in found if c.id == conversation_id), "")
            found = [(order, c) for order, c in found if order > (-at, key)]
        page = [c for _, c in found[:limit]]
        return page, (f"{page[-1].last_activity_ms}/{page[-1].id}" if len(found) > limit else None)

    def conversation_counts(self, tenant: str, *, agent: str) -> dict[str, dict[str, int]]:
        views: dict[str, tuple[Any, ...]] = {"all": ("*",), "mine": ("a", agent), "unassigned": ("a", None)}
        groups = [(*group, s) for group in views.values() for s in STATUSES]
        counts = iter(self.layout.count(self._table(tenant), "conv_count", groups))
        return {view: {s: next(counts) for s in STATUSES} for view in views}

    def unread_sum(self, tenant: str, *, agent: str, view: str = "all") -> int | None:
        table = self._table(tenant)
        if self.layout.scan(table, "marker_legacy", limit=1):
            return None
        group = _view_group(view, agent)
        [inbound] = self.layout.count(table, "conv_inbound", [group])
        seen_group = ("*", agent) if view == "all" else ("a", agent, group[1])
        [seen] = self.layout.count(table, "marker_seen", [seen_group])
        return inbound - seen

    def snoozed_due(self, tenant: str, *, now_ms: int, limit: int = 200) -> list[Conversation]:
        validate_limit(limit, maximum=MAX_SCAN)
        table = self._table(tenant)
        entries = self.layout.scan(table, "conv_snoozed", limit=limit)
        due = []
        for e in self.layout.fetch(table, entries):
            if e is None:
                continue
            c = Conversation.from_json(e.value, e.version)
            if c.status != "pending" or c.snoozed_until_ms is None:
                continue
            if c.snoozed_until_ms > now_ms:
                break  # the index orders by snoozed_until_ms: the rest are later
            due.append(c)
        return due

    # -- messages ---------------------------------------------------------------

    def _message_at(self, table: str, pointer: Any) -> Message | None:
        entry = self.kv.get(table, f"m/{pointer['c']}/{pointer['k']}")
        return None if entry is None else Message.from_json(entry.value, entry.version)

    def message_get(self, tenant: str, message_id: str) -> Message | None:
        table = self._table(tenant)
        pointer = self.kv.get(table, f"i/{message_id}")
        return None if pointer is None else self._message_at(table, pointer.value)

    def message_by_provider_id(self, tenant: str, provider_message_id: str) -> Message | None:
        table = self._table(tenant)
        pointer = self.kv.get(table, f"p/{provider_message_id}")
        return None if pointer is None else self._message_at(table, pointer.value)

    def message_page(
        self, tenant: str, conversation_id: str, *, after: str | None = None, limit: int = 100
    ) -> list[Message]:
        validate_limit(limit, maximum=MAX_SCAN)
        prefix = f"m/{conversation_id}/"
        entries = self.kv.scan(
            self._table(tenant), prefix=prefix, after=None if after is None else prefix + after, limit=limit
        )
        return [Message.from_json(e.value, e.version) for e in entries]

    # -- the atomic write -------------------------------------------------------

    def _previous(self, table: str, key: str, change: Change) -> Mapping[str, Any]:
        """Return the stored value of ``change.conversation`` at its expected revision (or what its indexes read)."""
        conversation = change.conversation
        assert conversation is not None
        previous = change.previous
        if previous is not None:
            if previous.id != conversation.id or previous.revision != conversation.revision:
                raise ValueError("change.previous is not the conversation at the revision written")
            return _indexed_of(previous)  # all the indexes read of the stored value (see _indexed)
        old = self.kv.get(table, key)
        if old is None or old.version != conversation.revision:
            raise StaleRevision(
                "conversation changed concurrently", current_version=None if old is None else old.version
            )
        value: Mapping[str, Any] = old.value
        return value

    def write(self, tenant: str, change: Change) -> Change:
        table = self._table(tenant)
        ops: dict[str, Op] = {}
        changes: list[RecordChange] = []
        conversation = change.conversation
        conversation_key = None
        old_data: Mapping[str, Any] | None = None
        if conversation is not None:
            digest = chat_hash(conversation.identity)
            conversation_key = f"k/{digest}"
            data = conversation.to_json()
            if conversation.revision == 0:
                ops[conversation_key] = Put(conversation_key, data, ABSENT)
                ops[f"c/{conversation.id}"] = Put(f"c/{conversation.id}", {"k": digest}, ABSENT)
            else:
                old_data = self._previous(table, conversation_key, change)
                ops[conversation_key] = Put(conversation_key, data, conversation.revision)
                ops[f"c/{conversation.id}"] = same_incarnation(conversation.id)
            changes.append(RecordChange(CONVERSATION, conversation_key, old_data, data))
        for m in change.removed:
            for key in (f"i/{m.id}", *(f"i/{a}" for a in m.aliases)):
                ops[key] = Delete(key)
            if m.provider_message_id:
                ops[f"p/{m.provider_message_id}"] = Delete(f"p/{m.provider_message_id}")
            key = f"m/{m.conversation_id}/{m.sort_key}"
            ops[key] = Delete(key, m.revision)
        released = {key for key, op in ops.items() if isinstance(op, Delete)}
        claims: list[tuple[str, Message]] = list(change.aliases)
        for m in change.messages:
            key = f"m/{m.conversation_id}/{m.sort_key}"
            pointer = {"c": m.conversation_id, "k": m.sort_key}
            if key in released:  # moved back onto its own key: the delete and the put merge
                ops[key] = Put(key, m.to_json(), ops[key].expect if m.revision == 0 else m.revision)
            else:
                ops[key] = Put(key, m.to_json(), ABSENT if m.revision == 0 else m.revision)
            if m.revision == 0:
                claims.extend((message_id, m) for message_id in (m.id, *m.aliases))
            if m.provider_message_id:
                ops[f"p/{m.provider_message_id}"] = Put(f"p/{m.provider_message_id}", pointer)
        for message_id, m in claims:
            key = f"i/{message_id}"
            pointer = {"c": m.conversation_id, "k": m.sort_key}
            # An id released by a removal in this change may be claimed again by its successor.
            ops[key] = Put(key, pointer, ANY if key in released else ABSENT)
        for e in change.events:
            key = f"v/{e.conversation_id}/{e.id}"
            ops[key] = Put(key, e.to_json(), ABSENT)
        changes += self._marker_changes(table, change, old_data, ops)
        try:
            results = self.layout.commit(table, list(ops.values()), changes)
        except ConflictError as exc:
            raise _stale("inbox record", exc) from None
        # Every Put's result is its written entry (the Deletes' None are never looked up here).
        versions = {op.key: r.version for op, r in zip(ops.values(), results, strict=True) if r is not None}
        new_conversation = None
        if conversation is not None and conversation_key is not None:
            new_conversation = replace(conversation, revision=versions[conversation_key])
        messages = tuple(replace(m, revision=versions[f"m/{m.conversation_id}/{m.sort_key}"]) for m in change.messages)
        return Change(new_conversation, messages, change.removed, change.aliases, events=change.events)

    def _marker_changes(
        self, table: str, change: Change, old_data: Mapping[str, Any] | None, ops: dict[str, Op]
    ) -> list[RecordChange]:
        """Add to ``ops`` the read markers ``change`` moves; return their record changes.

        A new inbound message adds one to ``seen_inbound`` of every marker at or
        after it, a removed one takes one away; a new assignee is copied into
        every marker (their counts move to the new view). Only the
        conversation's own markers are read (``r/<conv id>/``: one per agent who
        read it), and only when one of these happens.
        """
        deltas: dict[str, list[tuple[str, int]]] = {}
        for m in change.messages:
            if m.revision == 0 and m.direction == "in":
                deltas.setdefault(m.conversation_id, []).append((m.sort_key, 1))
        for m in change.removed:
            if m.direction == "in":
                deltas.setdefault(m.conversation_id, []).append((m.sort_key, -1))
        conversation = change.conversation
        reassigned = (
            conversation is not None and old_data is not None and old_data.get("assignee") != conversation.assignee
        )
        touched = set(deltas)
        if reassigned:
            assert conversation is not None
            touched.add(conversation.id)
        out: list[RecordChange] = []
        for conversation_id in sorted(touched):
            if conversation is not None and conversation.id == conversation_id:
                if conversation.revision == 0:
                    continue  # a new conversation has no markers yet
            else:
                # Markers are written with their conversation's revision moving, so a write of
                # messages alone must pin the conversation to see every marker.
                key = self._conversation_key(table, conversation_id)
                entry = None if key is None else self.kv.get(table, key)
                if key is None or entry is None:
                    continue
                ops.setdefault(key, Check(key, entry.version))
            moves = deltas.get(conversation_id, [])
            markers, guard = self._markers_of(table, conversation_id)
            ops[guard.key] = guard
            for e in markers:
                new = dict(e.value)
                if new.get("seen_inbound") is not None:
                    new["seen_inbound"] += sum(d for key, d in moves if key <= new["message_sort_key"])
                if reassigned and conversation is not None and conversation.id == conversation_id:
                    new["assignee"] = conversation.assignee
                if new != e.value:
                    ops[e.key] = Put(e.key, new, e.version)
                    out.append(RecordChange(MARKER, e.key, e.value, new))
        return out

    def _markers_of(self, table: str, conversation_id: str) -> tuple[list[Entry], Check]:
        """Return the conversation's markers and a ``Check`` that fails if one is written after this read."""
        prefix, after, found = f"r/{conversation_id}/", None, []
        while True:
            page = self.kv.scan(table, prefix=prefix, after=after, limit=MAX_SCAN)
            found += page
            if len(page) < MAX_SCAN:
                break
            after = page[-1].key
        key = prefix + MARKER_GUARD
        guard = next((e for e in found if e.key == key), None)
        markers = [e for e in found if e.key != key]
        return markers, Check(key, ABSENT if guard is None else guard.version)

    # -- notes and markers ------------------------------------------------------

    def _guarded(self, table: str, conversation_id: str, ops: list[Op]) -> list[Any]:
        """Commit ``ops`` only while the conversation exists (retrying if it merely changed)."""
        key = self._conversation_key(table, conversation_id)
        if key is None:
            raise NotFound("conversation not found")

        def attempt() -> list[Any]:
            entry = self.kv.get(table, key)
            if entry is None or entry.value.get("id") != conversation_id:
                raise NotFound("conversation not found")
            try:
                return self.kv.commit(table, [*ops, Check(key, entry.version), same_incarnation(conversation_id)])
            except ConflictError as exc:
                if exc.key == f"c/{conversation_id}":
                    raise NotFound("conversation not found") from None
                if exc.key != key:
                    raise _stale("record", exc) from None
                raise  # only the conversation moved: read it again

        return chat_retry(attempt, busy="conversation too busy, try again", retry_on=ConflictError)

    def note_add(self, tenant: str, note: Note) -> Note:
        key = f"n/{note.conversation_id}/{note.id}"
        self._guarded(self._table(tenant), note.conversation_id, [Put(key, note.to_json(), ABSENT)])
        return note

    def note_page(self, tenant: str, conversation_id: str, *, after: str | None = None, limit: int = 50) -> list[Note]:
        validate_limit(limit, maximum=MAX_SCAN)
        prefix = f"n/{conversation_id}/"
        entries = self.kv.scan(
            self._table(tenant), prefix=prefix, after=None if after is None else prefix + after, limit=limit
        )
        return [Note.from_json(e.value) for e in entries]

    def conversation_search_scan(
        self, tenant: str, prefix: str, *, after: tuple[str, str] | None = None, limit: int = 200
    ) -> list[tuple[str, Conversation]]:
        validate_limit(limit, maximum=MAX_SCAN)
        table = self._table(tenant)
        cursor = None
        if after is not None:
            # Resume after that conversation's entry; if it is gone, after every entry of its key.
            record_key = self._conversation_key(table, after[1]) or "~"
            cursor = f"{TEXT_BASE}{encode_component(after[0])}{record_key}"
        entries = self.layout.scan(table, "conv_text", (), text_prefix=prefix, after=cursor, limit=limit)
        keys = [decode(e.key[len(TEXT_BASE) : -len(e.value["pk"])])[0] for e in entries]
        records = self.layout.fetch(table, entries)
        return [
            (str(key), Conversation.from_json(r.value, r.version))
            for key, r in zip(keys, records, strict=True)
            if r is not None
        ]

    def event_page(
        self, tenant: str, conversation_id: str, *, after: str | None = None, limit: int = 50
    ) -> list[ConversationEvent]:
        validate_limit(limit, maximum=MAX_SCAN)
        prefix = f"v/{conversation_id}/"
        entries = self.kv.scan(
            self._table(tenant), prefix=prefix, after=None if after is None else prefix + after, limit=limit
        )
        return [ConversationEvent.from_json(e.value) for e in entries]

    def marker_get(self, tenant: str, conversation_id: str, agent: str) -> ReadMarker | None:
        entry = self.kv.get(self._table(tenant), f"r/{conversation_id}/{agent}")
        if entry is None or entry.value.get("erased"):
            return None
        return ReadMarker.from_json(entry.value, entry.version)

    def markers_get(self, tenant: str, conversation_ids: list[str], agent: str) -> list[ReadMarker | None]:
        if not conversation_ids:
            return []
        entries = self.kv.get_many(self._table(tenant), [f"r/{cid}/{agent}" for cid in conversation_ids])
        return [
            None if e is None or e.value.get("erased") else ReadMarker.from_json(e.value, e.version) for e in entries
        ]

    def _seen_at(self, table: str, conversation: Conversation, current: Mapping[str, Any] | None, key: str) -> int:
        """Return how many inbound messages of ``conversation`` sort at or before ``key`` (exact).

        Two scans advance together and the first to end answers: forward from
        the current marker (its count plus the inbound messages up to ``key``)
        and from ``key`` to the end (``inbound_count`` minus the inbound
        messages after ``key``). Marking the newest message read costs one
        short read; a marker far from both ends costs what separates it from
        the nearer one.
        """
        prefix = f"m/{conversation.id}/"
        seen, since = 0, None
        if current is not None and current.get("seen_inbound") is not None and current["message_sort_key"] <= key:
            seen, since = int(current["seen_inbound"]), prefix + current["message_sort_key"]
        before_after: str | None = since
        after_after: str | None = prefix + key
        later = 0
        while True:
            page = self.kv.scan(table, prefix=prefix, after=before_after, limit=MESSAGE_BATCH)
            within = [e for e in page if e.key[len(prefix) :] <= key]
            seen += sum(1 for e in within if e.value.get("direction") == "in")
            if len(within) < len(page) or len(page) < MESSAGE_BATCH:
                return seen
            before_after = page[-1].key
            page = self.kv.scan(table, prefix=prefix, after=after_after, limit=MESSAGE_BATCH)
            later += sum(1 for e in page if e.value.get("direction") == "in")
            if len(page) < MESSAGE_BATCH:
                return max(0, conversation.inbound_count - later)
            after_after = page[-1].key

    def marker_put(self, tenant: str, marker: ReadMarker) -> ReadMarker:
        table = self._table(tenant)
        key = f"r/{marker.conversation_id}/{marker.agent}"
        conversation_key = self._conversation_key(table, marker.conversation_id)
        if conversation_key is None:
            raise NotFound("conversation not found")

        def attempt() -> ReadMarker:
            entry = self.kv.get(table, conversation_key)
            if entry is None or entry.value.get("id") != marker.conversation_id:
                raise NotFound("conversation not found")
            conversation = Conversation.from_json(entry.value, entry.version)
            current = self.kv.get(table, key)
            if (current.version if current is not None else 0) != marker.revision:
                raise StaleRevision(
                    "read marker changed concurrently", current_version=None if current is None else current.version
                )
            old = None if current is None else current.value
            seen = self._seen_at(table, conversation, old, marker.message_sort_key)
            data = _marker_json(marker, seen, conversation.assignee)
            ops: list[Op] = [
                Put(key, data, ABSENT if current is None else current.version),
                Check(conversation_key, entry.version),  # no message arrived while counting
                same_incarnation(marker.conversation_id),
                Add(f"r/{marker.conversation_id}/{MARKER_GUARD}", 1),  # see the module docstring
            ]
            try:
                results = self.layout.commit(table, ops, [RecordChange(MARKER, key, old, data)])
            except ConflictError as exc:
                if exc.key == conversation_key:
                    raise  # a message arrived while counting: count again
                if exc.key == f"c/{marker.conversation_id}":
                    raise NotFound("conversation not found") from None
                raise _stale("read marker", exc) from None
            written = results[0]
            assert written is not None  # a Put returns its entry
            return replace(marker, revision=written.version, seen_inbound=seen)

        return chat_retry(attempt, busy="conversation too busy, try again", retry_on=ConflictError)

    def markers_backfill(self, tenant: str, *, limit: int = 200) -> int:
        validate_limit(limit, maximum=MAX_SCAN)
        table = self._table(tenant)
        changed = 0
        copies = self.kv.scan(table, prefix="a/", limit=limit)
        if copies:
            self.kv.commit(table, [Delete(e.key) for e in copies])
            changed += len(copies)
        for e in self.layout.scan(table, "marker_legacy", limit=limit):
            changed += self._backfill(table, e.value["pk"])
        return changed

    def _backfill(self, table: str, key: str) -> int:
        """Give the legacy marker at ``key`` its ``seen_inbound`` (exact); return 1 if it changed."""
        conversation_id = key.split("/")[1]

        def attempt() -> int:
            current = self.kv.get(table, key)
            if current is None or current.value.get("seen_inbound") is not None or current.value.get("erased"):
                return 0
            conversation_key = self._conversation_key(table, conversation_id)
            entry = None if conversation_key is None else self.kv.get(table, conversation_key)
            ops: list[Op]
            if conversation_key is None or entry is None or entry.value.get("id") != conversation_id:
                data = dict(current.value, erased=True)  # its conversation was erased: the purge removes it
                ops = [Put(key, data, current.version)]
            else:
                conversation = Conversation.from_json(entry.value, entry.version)
                seen = self._seen_at(table, conversation, None, current.value["message_sort_key"])
                data = dict(current.value, seen_inbound=seen, assignee=conversation.assignee)
                ops = [
                    Put(key, data, current.version),
                    Check(conversation_key, entry.version),
                    same_incarnation(conversation_id),
                    Add(f"r/{conversation_id}/{MARKER_GUARD}", 1),
                ]
            self.layout.commit(table, ops, [RecordChange(MARKER, key, current.value, data)])
            return 1

        try:
            # A legacy marker races its chat's new messages: with 8 attempts more ticks skip it.
            return cas_retry(attempt, what="read marker", attempts=CONTENDED_ATTEMPTS)
        except Conflict:
            return 0  # it keeps changing: the next tick backfills it

    # -- erasure ----------------------------------------------------------------

    def conversation_delete(self, tenant: str, conversation: Conversation) -> None:
        table = self._table(tenant)
        key = f"k/{chat_hash(conversation.identity)}"
        entry = self.kv.get(table, key)
        if entry is None or entry.value.get("id") != conversation.id:
            raise NotFound("conversation not found")
        if entry.version != conversation.revision:
            raise StaleRevision("conversation changed concurrently", current_version=entry.version)
        ops: list[Op] = [
            Delete(key, conversation.revision),
            Delete(f"c/{conversation.id}", POINTER_VERSION),
            Delete(activity_key(conversation.id, entry.value["last_activity_ms"])),
            Put(f"e/{conversation.id}", {"at_ms": now_ms()}),
        ]
        changes = [RecordChange(CONVERSATION, key, entry.value, None)]
        # The markers stay until the purge (it counts them) but leave every count now; a marker
        # written after this read makes the delete retry (its counter's version moved).
        markers, guard = self._markers_of(table, conversation.id)
        ops.append(Delete(guard.key, guard.expect))
        for marker in markers:
            if not marker.value.get("erased"):
                data = dict(marker.value, erased=True)
                ops.append(Put(marker.key, data, marker.version))
                changes.append(RecordChange(MARKER, marker.key, marker.value, data))
        try:
            self.layout.commit(table, ops, changes)
        except ConflictError as exc:
            raise _stale("conversation", exc) from None

    def erasure_pending(self, tenant: str, conversation_id: str) -> bool:
        return self.kv.get(self._table(tenant), f"e/{conversation_id}") is not None

    def conversation_purge(self, tenant: str, conversation_id: str, *, limit: int = 500) -> int:
        validate_limit(limit, maximum=MAX_SCAN)
        table = self._table(tenant)
        removed = 0

        def purge_batch(prefix: str, limit: int) -> int:
            """Delete up to ``limit`` entries under ``prefix`` in one commit; return how many."""
            entries = self.kv.scan(table, prefix=prefix, limit=limit)
            if entries:
                ops: dict[str, Op] = {}
                changes: list[RecordChange] = []
                for e in entries:
                    ops[e.key] = Delete(e.key)
                    if prefix.startswith("r/"):
                        ops[e.key] = Delete(e.key, e.version)
                        changes.append(RecordChange(MARKER, e.key, e.value, None))
                    if prefix.startswith("m/"):
                        value = e.value
                        for message_id in (value["id"], *value.get("aliases", ())):
                            ops[f"i/{message_id}"] = Delete(f"i/{message_id}")
                        if value.get("provider_message_id"):
                            pid = value["provider_message_id"]
                            pointer = self.kv.get(table, f"p/{pid}")
                            if pointer is not None and pointer.value.get("c") == conversation_id:
                                ops[f"p/{pid}"] = Delete(f"p/{pid}", pointer.version)
                # A provider index or a marker moved meanwhile: ConflictError, and cas_retry scans again.
                self.layout.commit(table, list(ops.values()), changes)
            return len(entries)

        for prefix in (f"{kind}/{conversation_id}/" for kind in ("m", "n", "v", "r")):
            while removed < limit:
                batch = min(100, limit - removed)
                done = cas_retry(
                    lambda: purge_batch(prefix, batch),  # noqa: B023 - called at once
                    what="conversation",
                    attempts=PURGE_ATTEMPTS,
                )
                if not done:
                    break
                removed += done
        if removed == 0:
            self.kv.commit(table, [Delete(f"e/{conversation_id}")])
        return removed

    # -- settings: their own table (``inbox/<tenant>/settings``, key ``inbox``) -----------

    def settings_get(self, tenant: str) -> InboxSettings:
        entry = self.kv.get(self.tables.table(tenant, SETTINGS), SETTINGS_KEY)
        return InboxSettings() if entry is None else InboxSettings.from_json(entry.value, entry.version)

    def settings_put(self, tenant: str, settings: InboxSettings) -> InboxSettings:
        table = self.tables.table(tenant, SETTINGS)
        expect = ABSENT if settings.revision == 0 else settings.revision
        try:
            (entry,) = self.kv.commit(table, [Put(SETTINGS_KEY, settings.to_json(), expect)])
        except ConflictError as exc:
            raise _stale("inbox settings", exc) from None
        assert entry is not None  # a Put returns its written entry
        return replace(settings, revision=entry.version)
