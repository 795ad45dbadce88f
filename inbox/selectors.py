"""Inbox reads: conversation lists with unread badges, threads, notes, handoff state.

Tenant first, the rest keyword-only. A conversation of another tenant is
``NotFound`` (it is simply absent from this tenant's store). Times are epoch ms.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from botmesh_admin.channels.domain import CHANNEL_KINDS
from botmesh_admin.errors import NotFound, ValidationError
from botmesh_admin.pagination import cursor_check, page_of, validate_limit
from botmesh_admin.validation import validate_text

from .domain import (
    CONVERSATION_STATUSES,
    Conversation,
    ConversationEvent,
    InboxSettings,
    Message,
    Note,
    ReadMarker,
    bot_reply_id,
    conversation_search_keys,
    now_ms,
    sort_key,
    validate_agent,
    validate_chat_key,
    validate_conversation_id,
    validate_ms,
)
from .stores import default_store
from .stores.base import VIEWS, InboxStore, conversation_cursor

SCAN_BATCH = 200
MAX_SCANNED = 5000
UNREAD_BATCH = 500
# The shapes of the lists' cursors: ``conversation_cursor``, ``Message.sort_key`` and ``new_note_id``.
CONVERSATION_CURSOR = re.compile(r"[0-9]{1,16}/cv_[0-9a-f]{20}")
MESSAGE_CURSOR = re.compile(r"[0-9]{13,16}/[^\s/]{1,200}")
NOTE_CURSOR = re.compile(r"n_[0-9]{13,16}_[0-9a-f]{8,12}")


@dataclass(frozen=True)
class ConversationRow:
    """A list row: the conversation, its effective status and the agent's unread count."""

    conversation: Conversation
    status: str
    unread: int


def effective_status(conversation: Conversation, now: int | None = None) -> str:
    """Return the status an agent sees: a snoozed conversation whose time has come is ``open``.

    The wake-up job (``inbox.tick``, every ``services.TICK_EVERY_S`` seconds)
    then stores it as open; until it runs, lists filtered by status and the
    counts still place it among the pending ones (see ``conversation_list``).
    """
    c = conversation
    if c.status == "pending" and c.snoozed_until_ms is not None and c.snoozed_until_ms <= (now or now_ms()):
        return "open"
    return c.status


def conversation_get(tenant: str, conversation_id: str, *, store: InboxStore | None = None) -> Conversation:
    """Return the conversation; raise ``NotFound`` if it does not exist in ``tenant``."""
    validate_conversation_id(conversation_id)
    conversation = (store or default_store()).conversation_get(tenant, conversation_id)
    if conversation is None:
        raise NotFound(f"conversation {conversation_id} not found")
    return conversation


def _unread_by_scan(tenant: str, conversation: Conversation, marker: ReadMarker, store: InboxStore) -> int:
    """Count the inbound messages after ``marker`` by reading them (a marker stored without a count)."""
    if conversation.last_message_id is None or marker.message_sort_key >= sort_key(
        conversation.last_activity_ms, conversation.last_message_id
    ):
        return 0
    count, after = 0, marker.message_sort_key
    while True:
        page = store.message_page(tenant, conversation.id, after=after, limit=UNREAD_BATCH)
        count += sum(1 for m in page if m.direction == "in")
        if len(page) < UNREAD_BATCH:
            return count
        after = page[-1].sort_key


def _unread(tenant: str, conversation: Conversation, marker: ReadMarker | None, store: InboxStore) -> int:
    if marker is None:
        return conversation.inbound_count
    if marker.seen_inbound is None:
        return _unread_by_scan(tenant, conversation, marker, store)
    return max(0, conversation.inbound_count - marker.seen_inbound)


def unread_count(tenant: str, conversation: Conversation, *, agent: str, store: InboxStore | None = None) -> int:
    """Return how many inbound messages come after ``agent``'s read marker (exact, O(1)).

    ``conversation.inbound_count`` minus the marker's ``seen_inbound`` (the
    inbound messages at or before it, kept by the store); without a marker
    every inbound message is unread. A marker stored before the store kept its
    count is counted by reading the messages after it, until it is backfilled.
    """
    store = store or default_store()
    return _unread(tenant, conversation, store.marker_get(tenant, conversation.id, agent), store)


def conversation_unread(tenant: str, conversation_id: str, *, agent: str, store: InboxStore | None = None) -> int:
    """Return ``agent``'s unread inbound messages in the conversation (``unread_count``); ``NotFound`` if absent."""
    store = store or default_store()
    return unread_count(tenant, conversation_get(tenant, conversation_id, store=store), agent=agent, store=store)


def _validate_view(view: object) -> str:
    if view not in VIEWS:
        raise ValidationError("view", f"must be one of {', '.join(VIEWS)}")
    return str(view)


def _matches(
    c: Conversation,
    *,
    agent: str,
    view: str,
    status: str | None,
    channel: str | None,
    now: int,
    channel_name: str | None = None,
    contact_id: str | None = None,
) -> bool:
    """Return True if ``c`` (as fetched) still belongs in the list the filters describe."""
    if contact_id is not None and c.contact_id != contact_id:
        return False
    if view == "mine" and c.assignee != agent or view == "unassigned" and c.assignee is not None:
        return False
    if channel is not None and c.channel != channel:
        return False
    if channel_name is not None and c.channel_name != channel_name:
        return False
    return status is None or c.status == status and effective_status(c, now) == status


def conversation_list(
    tenant: str,
    *,
    agent: str,
    view: str = "all",
    status: str | None = None,
    channel: str | None = None,
    unread_only: bool = False,
    limit: int = 50,
    after: str | None = None,
    store: InboxStore | None = None,
    channel_name: str | None = None,
    contact_id: str | None = None,
) -> tuple[list[ConversationRow], str | None]:
    """Return one page of conversations, newest activity first, and the cursor of the next page.

    ``view``: ``all``, ``mine`` (assigned to ``agent``) or ``unassigned``;
    ``status``: open / pending / resolved; ``channel``: whatsapp, telegram…;
    ``channel_name``: the tenant's channel (number or bot) that received them
    (an unknown one: no rows); ``contact_id``: the CRM contact linked to them
    (the ``conv_contact`` index; an unknown contact: no rows);
    ``unread_only``: only rows where ``agent`` has unread messages. Each row
    shows its effective status (``effective_status``) and its exact unread count.

    Cost: the store reads one index page of the filters' combination, its
    records and the agent's read markers (one read each): O(limit). With
    ``unread_only`` the rows without unread messages for the agent in the
    range (those it has fully read, or without an inbound message) are
    examined and skipped — by the store's index entries and the agent's
    markers, without reading their records (``unread_candidates``) — a first
    batch of ``2 × limit``, then batches sized by the share of rows kept so far
    (``_next_batch``, at most ``SCAN_BATCH``): O(limit + skipped rows), which does not grow with the tenant; at most
    ``MAX_SCANNED`` conversations are examined per call and the cursor
    continues from there.

    Status filters use the stored status: a snoozed conversation whose time has
    come leaves the ``pending`` list at once but joins the ``open`` list when
    the wake-up job stores it as open, at most ``services.TICK_EVERY_S``
    seconds later.
    """
    validate_agent(agent)
    _validate_view(view)
    if status is not None and status not in CONVERSATION_STATUSES:
        raise ValidationError("status", f"must be one of {', '.join(CONVERSATION_STATUSES)}")
    if channel is not None and channel not in CHANNEL_KINDS:
        raise ValidationError("channel", f"must be one of {', '.join(CHANNEL_KINDS)}")
    limit = validate_limit(limit)
    after = cursor_check(after, CONVERSATION_CURSOR)
    if channel_name is not None:
        from botmesh_admin.kv.tenant import validate_id

        validate_id(channel_name, "channel_name")
    if contact_id is not None:
        from botmesh_admin.kv.tenant import validate_id

        validate_id(contact_id, "contact")
    store = store or default_store()
    now = now_ms()
    # An unread-only page skips what the agent has read: its first batch examines twice the page, so a
    # list where most rows are unread fills in one round trip instead of three (1M tenant, PostgreSQL).
    batch = min(SCAN_BATCH, 2 * limit) if unread_only else limit
    rows: list[ConversationRow] = []
    cursor, scanned = after, 0

    def examine(cursor: str | None, batch: int) -> tuple[list[tuple[Conversation, ReadMarker | None]], str | None, int]:
        if unread_only and channel_name is None and contact_id is None:
            # The store skips, from its index, conversations the agent has read (their records unread).
            return store.unread_candidates(
                tenant, agent=agent, view=view, status=status, channel=channel, after=cursor, limit=batch
            )
        page, next_cursor = store.conversation_page(
            tenant,
            view=view,
            agent=agent,
            status=status,
            channel=channel,
            after=cursor,
            limit=batch,
            channel_name=channel_name,
            contact_id=contact_id,
        )
        markers = store.markers_get(tenant, [c.id for c in page], agent)
        return list(zip(page, markers, strict=True)), next_cursor, len(page)

    while scanned < MAX_SCANNED:
        pairs, next_cursor, examined = examine(cursor, batch)
        scanned += examined
        for i, (c, marker) in enumerate(pairs):
            cursor = conversation_cursor(c)
            if not _matches(
                c,
                agent=agent,
                view=view,
                status=status,
                channel=channel,
                now=now,
                channel_name=channel_name,
                contact_id=contact_id,
            ):
                continue
            unread = _unread(tenant, c, marker, store)
            if unread_only and not unread:
                continue
            rows.append(ConversationRow(c, effective_status(c, now), unread))
            if len(rows) == limit:
                last_of_all = i == len(pairs) - 1 and next_cursor is None
                return rows, None if last_of_all else cursor
        if next_cursor is None:
            return rows, None
        cursor = next_cursor
        batch = _next_batch(limit - len(rows), kept=len(rows), scanned=scanned)
    return rows, cursor


def _next_batch(missing: int, *, kept: int, scanned: int) -> int:
    """Return how many conversations to read next for the ``missing`` rows of a page.

    Sized by the share of rows kept so far (with a quarter more, so one more
    batch usually completes the page): an unread-only page whose first batch
    kept two rows in three reads about 1.4 × the rows it still lacks, not
    twice the batch before (which read 3 × ``limit`` conversations and markers
    for a page of ``limit``). Nothing kept yet: twice what was read, so a long
    run of read conversations is crossed in a few batches. At most ``SCAN_BATCH``.
    """
    if kept == 0:
        return min(SCAN_BATCH, max(missing, 2 * scanned))
    return min(SCAN_BATCH, max(1, -(-missing * scanned * 5 // (kept * 4))) + 1)


def _unread_total_by_walk(tenant: str, *, agent: str, view: str, store: InboxStore) -> int:
    """Return the unread total by reading every conversation of ``view`` (the definition; O(tenant))."""
    total, cursor = 0, None
    while True:
        rows, cursor = conversation_list(
            tenant, agent=agent, view=view, unread_only=True, limit=200, after=cursor, store=store
        )
        total += sum(r.unread for r in rows)
        if cursor is None:
            return total


def unread_total(tenant: str, *, agent: str, view: str = "all", store: InboxStore | None = None) -> int:
    """Return ``agent``'s unread inbound messages over every conversation of ``view`` (exact).

    O(1): the inbound messages counted over the view's conversations minus
    those the agent's read markers have seen in them (two count reads). While
    the tenant still holds read markers stored before the counts existed (the
    wake-up job backfills them), the conversations are walked instead.
    """
    validate_agent(agent)
    _validate_view(view)
    store = store or default_store()
    total = store.unread_sum(tenant, agent=agent, view=view)
    if total is None:
        return _unread_total_by_walk(tenant, agent=agent, view=view, store=store)
    return total


def conversation_counts(tenant: str, *, agent: str, store: InboxStore | None = None) -> dict[str, dict[str, int]]:
    """Return ``{view: {status: conversations}}`` for ``all``, ``mine`` and ``unassigned`` (exact, O(1)).

    Counted by stored status: a snoozed conversation whose time has come counts
    as pending until the wake-up job reopens it (at most
    ``services.TICK_EVERY_S`` seconds).
    """
    validate_agent(agent)
    return (store or default_store()).conversation_counts(tenant, agent=agent)


def conversation_count(
    tenant: str, *, agent: str, view: str = "all", status: str | None = None, store: InboxStore | None = None
) -> int:
    """Return how many conversations ``view`` holds (of ``status``, or of any status); see ``conversation_counts``."""
    _validate_view(view)
    if status is not None and status not in CONVERSATION_STATUSES:
        raise ValidationError("status", f"must be one of {', '.join(CONVERSATION_STATUSES)}")
    counts = conversation_counts(tenant, agent=agent, store=store)[view]
    return counts[status] if status is not None else sum(counts.values())


def message_list(
    tenant: str,
    conversation_id: str,
    *,
    after: str | None = None,
    limit: int = 100,
    store: InboxStore | None = None,
) -> tuple[list[Message], str | None]:
    """Return messages in order (timestamp, then id) after the cursor, and the next cursor."""
    store = store or default_store()
    conversation_get(tenant, conversation_id, store=store)
    limit = validate_limit(limit)
    after = cursor_check(after, MESSAGE_CURSOR)
    page = page_of(
        store.message_page(tenant, conversation_id, after=after, limit=limit + 1), limit, lambda m: m.sort_key
    )
    return page.items, page.next


LATEST_FIRST_WINDOW_MS = 3_600_000  # the thread view first reads the last hour of a conversation
LATEST_WIDEN = 8  # then a window this many times longer, until it holds enough messages


def _tail(
    store: InboxStore, tenant: str, conversation_id: str, after: str | None, limit: int
) -> tuple[list[Message], int]:
    """Return the last ``limit`` messages after the key ``after`` (oldest first) and how many were read."""
    window: list[Message] = []
    read = 0
    while True:
        page = store.message_page(tenant, conversation_id, after=after, limit=1000)
        read += len(page)
        window = (window + page)[-limit:]
        if len(page) < 1000:
            return window, read
        after = page[-1].sort_key


def message_latest(
    tenant: str, conversation_id: str, *, limit: int = 100, store: InboxStore | None = None
) -> list[Message]:
    """Return the newest ``limit`` messages of a conversation, oldest first (the thread view).

    Stores scan forward only, so a long conversation is not read whole: the
    messages of the last hour before its newest message are read first, then
    of a window ``LATEST_WIDEN`` times longer, until the window holds
    ``limit`` messages or reaches the conversation's start. Exact either way
    (messages are ordered by timestamp, and the newest is ``last_activity_ms``).
    """
    store = store or default_store()
    conversation = conversation_get(tenant, conversation_id, store=store)
    span_ms = LATEST_FIRST_WINDOW_MS
    while conversation.message_count > limit:
        since = conversation.last_activity_ms - span_ms
        if since <= 0:
            break
        window, read = _tail(store, tenant, conversation_id, f"{since:013d}", limit)
        if read >= limit:
            return window
        span_ms *= LATEST_WIDEN
    return _tail(store, tenant, conversation_id, None, limit)[0]


def message_get(tenant: str, message_id: str, *, store: InboxStore | None = None) -> Message:
    """Return a message by id (or alias); ``NotFound`` if absent."""
    message = (store or default_store()).message_get(tenant, message_id)
    if message is None:
        raise NotFound(f"message {message_id} not found")
    return message


def note_list(
    tenant: str,
    conversation_id: str,
    *,
    limit: int = 50,
    after: str | None = None,
    store: InboxStore | None = None,
) -> tuple[list[Note], str | None]:
    """Return notes oldest first; ``after`` is the id of the last note of the previous page."""
    store = store or default_store()
    conversation_get(tenant, conversation_id, store=store)
    limit = validate_limit(limit)
    after = cursor_check(after, NOTE_CURSOR)
    page = page_of(store.note_page(tenant, conversation_id, after=after, limit=limit + 1), limit, lambda n: n.id)
    return page.items, page.next


SEARCH_BUDGET = 2000  # index entries one search page reads at most (then it continues from a cursor)
SEARCH_CURSOR = re.compile(r"[^\s/]{1,64}/cv_[0-9a-f]{20}")
TEXT_SCAN_CONVERSATIONS = 100  # message text is looked for in this many most recently active conversations…
TEXT_SCAN_MESSAGES = 50  # …in this many of the newest messages of each
TEXT_SCAN_HITS = 20


def _search_prefix(terms: list[str]) -> str:
    """Return the term whose index range the search walks: the longest (the fewest entries, usually)."""
    from crm.domain import MAX_SEARCH_KEY

    return max(terms, key=len)[:MAX_SEARCH_KEY]


def conversation_search(
    tenant: str,
    q: str,
    *,
    agent: str,
    view: str = "all",
    status: str | None = None,
    channel: str | None = None,
    channel_name: str | None = None,
    limit: int = 50,
    after: str | None = None,
    store: InboxStore | None = None,
    contact_id: str | None = None,
) -> tuple[list[ConversationRow], str | None]:
    """Return conversations whose contact name or phone / Telegram id matches ``q``, and the next cursor.

    Every term of ``q`` (``crm.domain.search_terms``: folded words, or the
    digits of a phone number) must start one of the conversation's
    ``conversation_search_keys``. Rows come in the order of the search index
    (the walked term's matching key, then the conversation), filtered by the
    list's ``view`` / ``status`` / ``channel``. Cost: the ``conv_text`` index
    range of the longest term, at most ``SEARCH_BUDGET`` entries a page, and
    their records (O(page)); past the budget the cursor continues. Raise
    ``ValidationError`` naming ``q`` for a search over ``crm.selectors.MAX_QUERY``
    (200) characters or with a control character (the contacts search's rule), and
    naming ``after`` for a cursor of another list.
    """
    from crm.domain import search_match, search_terms
    from crm.selectors import MAX_QUERY

    validate_text(q, "q", max_len=MAX_QUERY, blank=True)
    validate_agent(agent)
    _validate_view(view)
    limit = validate_limit(limit)
    after = cursor_check(after, SEARCH_CURSOR)
    terms = search_terms(q or "")
    if not terms:
        return [], None
    store = store or default_store()
    prefix = _search_prefix(terms)
    position: tuple[str, str] | None = None
    if after is not None:
        key, _, conversation_id = after.partition("/")
        position = (key, conversation_id)
    if position is not None and not position[0].startswith(prefix):
        raise ValidationError("after", "not a cursor of this search")
    now = now_ms()
    rows: list[ConversationRow] = []
    read = 0
    while read < SEARCH_BUDGET:
        size = min(MAX_SCANNED, SEARCH_BUDGET - read, max(2 * limit, 50))
        hits = store.conversation_search_scan(tenant, prefix, after=position, limit=size)
        read += len(hits)
        for key, c in hits:
            position = (key, c.id)
            keys = conversation_search_keys(c.display_name, c.chat_key)
            if key != min((k for k in keys if k.startswith(prefix)), default=key):
                continue  # listed once, under its first key the term starts
            if not search_match(terms, keys) or not _matches(
                c,
                agent=agent,
                view=view,
                status=status,
                channel=channel,
                now=now,
                channel_name=channel_name,
                contact_id=contact_id,
            ):
                continue
            rows.append(ConversationRow(c, effective_status(c, now), unread_count(tenant, c, agent=agent, store=store)))
            if len(rows) == limit:
                return rows, f"{key}/{c.id}"
        if len(hits) < size:
            return rows, None
    return rows, None if position is None else f"{position[0]}/{position[1]}"


def message_search(
    tenant: str, q: str, *, agent: str, store: InboxStore | None = None
) -> tuple[list[tuple[ConversationRow, Message]], int]:
    """Return messages whose text contains ``q`` (folded: case and accents ignored), newest first, and
    how many conversations were searched.

    Message text has no index: this is a bounded scan of the newest
    ``TEXT_SCAN_MESSAGES`` messages of the ``TEXT_SCAN_CONVERSATIONS`` most
    recently active conversations (at most ``TEXT_SCAN_HITS`` hits); older
    messages are not searched, and the page says so.
    """
    from crm.domain import fold

    validate_agent(agent)
    needle = fold((q or "").strip())
    if not needle:
        return [], 0
    store = store or default_store()
    conversations, _ = store.conversation_page(tenant, limit=TEXT_SCAN_CONVERSATIONS)
    now = now_ms()
    hits: list[tuple[ConversationRow, Message]] = []
    for c in conversations:
        found = [
            m
            for m in message_latest(tenant, c.id, limit=TEXT_SCAN_MESSAGES, store=store)
            if m.text and needle in fold(m.text)
        ]
        if found:
            row = ConversationRow(c, effective_status(c, now), unread_count(tenant, c, agent=agent, store=store))
            hits += [(row, m) for m in reversed(found)]
        if len(hits) >= TEXT_SCAN_HITS:
            break
    return hits[:TEXT_SCAN_HITS], len(conversations)


def event_list(
    tenant: str,
    conversation_id: str,
    *,
    since_ms: int | None = None,
    limit: int = 200,
    store: InboxStore | None = None,
) -> list[ConversationEvent]:
    """Return the conversation's events (assigned, handoff, status: who and when) oldest first.

    ``since_ms``: only events at or after that time (the thread asks from its
    oldest shown message). One scan of at most ``limit`` (1..200) entries.
    """
    limit = validate_limit(limit)
    if since_ms is not None:
        validate_ms(since_ms, "since_ms")
    # Event ids start with their time (``new_event_id``): ``e_<ms - 1>`` sorts just before ``since_ms``.
    after = None if not since_ms else f"e_{since_ms - 1:013d}_~"
    return (store or default_store()).event_page(tenant, conversation_id, after=after, limit=limit)


@dataclass(frozen=True)
class HandoffState:
    """What a bot asks before answering a chat: may it answer (``handed_off`` False)?"""

    chat_key: str
    handed_off: bool
    conversation_id: str | None = None
    taken_by: str | None = None
    taken_at_ms: int | None = None
    released_by: str | None = None
    released_at_ms: int | None = None


def conversations_of_chat(
    tenant: str, chat_key: str, *, channel_name: str | None = None, store: InboxStore | None = None
) -> list[Conversation]:
    """Return the conversations of ``chat_key``: on ``channel_name``, else on each of the tenant's
    channels of the chat's kind (and the one without a channel). O(channels of that kind) reads.
    """
    store = store or default_store()
    if channel_name is not None:
        found = store.conversation_by_chat(tenant, chat_key, channel_name=channel_name)
        return [found] if found is not None else []
    from botmesh_admin.channels.selectors import channel_config_list_cached

    kind = chat_key.partition(":")[0]
    names: list[str | None] = [c.name for c in channel_config_list_cached(tenant, kind=kind)]
    conversations: dict[str, Conversation] = {}
    for name in [*names, None]:
        found = store.conversation_by_chat(tenant, chat_key, channel_name=name)
        if found is not None:
            conversations.setdefault(found.id, found)
    return list(conversations.values())


def _validate_channel_of_kind(tenant: str, channel_name: str, kind: str) -> None:
    """Raise ``ValidationError`` naming ``channel`` unless ``channel_name`` is one of the tenant's
    channel configurations of ``kind`` (a bot's typo must not read as "not handed off")."""
    from botmesh_admin.channels.selectors import channel_config_list_cached
    from botmesh_admin.kv.tenant import validate_id

    validate_id(channel_name, "channel")
    names = [c.name for c in channel_config_list_cached(tenant, kind=kind)]
    if channel_name not in names:  # the copy may predate a channel added in another process
        names = [c.name for c in channel_config_list_cached(tenant, kind=kind, refresh=True)]
    if channel_name not in names:
        known = f"its {kind} channels: {', '.join(names)}" if names else f"it has no {kind} channel"
        raise ValidationError("channel", f"is not a {kind} channel of this tenant ({known})")


def handoff_get(
    tenant: str, chat_key: str, *, channel_name: str | None = None, store: InboxStore | None = None
) -> HandoffState:
    """Return the handoff state of a chat (not handed off if the inbox does not know the chat).

    ``channel_name`` names the bot's channel (the number or Telegram bot); without
    it the chat counts as handed off if its conversation on any channel is.

    Raise ``ValidationError`` naming ``chat_id`` for a key without its kind
    (``validate_chat_key``: a bare number, a foreign prefix, over ``MAX_ID``
    characters) and naming ``channel`` for a name that is not one of the
    tenant's channels of the chat's kind.
    """
    kind = validate_chat_key(chat_key, "chat_id").partition(":")[0]
    if channel_name is not None:
        _validate_channel_of_kind(tenant, channel_name, kind)
    found = conversations_of_chat(tenant, chat_key, channel_name=channel_name, store=store)
    conversation = next((c for c in found if c.handed_off), found[0] if found else None)
    if conversation is None or conversation.handoff is None:
        return HandoffState(chat_key, False, conversation.id if conversation else None)
    h = conversation.handoff
    return HandoffState(chat_key, h.active, conversation.id, h.taken_by, h.taken_at_ms, h.released_by, h.released_at_ms)


def agent_is_member(tenant: str, agent: str) -> bool:
    """Return True if ``agent`` (a username) is a member of ``tenant`` (so it can be assigned)."""
    from botmesh_admin.tenancy.models import Membership

    return Membership.objects.filter(tenant_id=tenant, user__username=agent).exists()


def member_usernames(tenant: str) -> list[str]:
    """Return the usernames of ``tenant``'s members, sorted (the assign choices)."""
    from botmesh_admin.tenancy.models import Membership

    return sorted(Membership.objects.filter(tenant_id=tenant).values_list("user__username", flat=True))


def inbox_settings_get(tenant: str, *, store: InboxStore | None = None) -> InboxSettings:
    """Return what replying means in ``tenant`` (``InboxSettings``; the defaults if never set)."""
    return (store or default_store()).settings_get(tenant)


# -- the bot-facing inbound feed ----------------------------------------------------------

BOT_FEED_PER_CONVERSATION = 20
"""Inbound messages one conversation contributes to a page of ``bot_inbound_page`` at most (its newest)."""
BOT_FEED_WINDOW = 50
"""The newest messages of a conversation ``bot_inbound_page`` reads (``message_latest``)."""


@dataclass(frozen=True)
class BotInbound:
    """An inbound message as a bot reads it: where it belongs, what it says, whether it needs an answer.

    ``chat_id`` is the ledger's ``chatId`` (``whatsapp:<wa_id>``, ``telegram:<chat>``),
    ``channel_name`` the tenant's channel (number or bot) that received it;
    ``handed_off`` True while a human holds the conversation; ``answered`` True once
    this bot's reply to it (``replies.bot_reply_create``) exists.
    """

    message: Message
    conversation: Conversation
    answered: bool

    def to_json(self) -> dict[str, object]:
        """Return the API form."""
        m, c = self.message, self.conversation
        return {
            "id": m.id,
            "conversation_id": c.id,
            "chat_id": c.chat_key,
            "channel": c.channel,
            "channel_name": c.channel_name,
            "sender_id": m.sender_id,
            "sender_name": m.sender_name,
            "type": m.type,
            "text": m.text,
            "timestamp_ms": m.timestamp_ms,
            "handed_off": c.handed_off,
            "answered": self.answered,
        }


def bot_inbound_page(
    tenant: str,
    *,
    bot: str,
    since_ms: int,
    after: str | None = None,
    limit: int = 50,
    store: InboxStore | None = None,
) -> tuple[list[BotInbound], str | None]:
    """Return the inbound messages of ``tenant`` at or after ``since_ms`` (epoch ms) and the next cursor.

    Conversations come newest activity first, one page of ``limit`` (1..200) from
    the inbox list's index, so a page costs the page: the sweep stops at the first
    conversation whose last activity is older than ``since_ms`` (``next`` is then
    ``None``). Each contributes the inbound messages (not placeholders, not
    dropped) among its newest ``BOT_FEED_WINDOW`` messages that are at or after
    ``since_ms``, oldest first, at most the newest ``BOT_FEED_PER_CONVERSATION``.
    A message is ``answered`` once ``bot`` replied to it, or when an outbound
    message that is no bot reply follows it (an agent's reply, a bot's ledger
    record: the chat was answered before this bot came) — not a placeholder
    known only from a delivery status: its time is the receipt's, not the
    send's, so it cannot say it came after the customer (a read receipt of an
    older message silenced the bot). A conversation that
    changes during a sweep moves to the top, which a later sweep reads. Raise
    ``ValidationError`` naming ``since_ms``, ``limit`` or ``after``.
    """
    store = store or default_store()
    if isinstance(since_ms, bool) or not isinstance(since_ms, int) or since_ms < 0:
        raise ValidationError("since_ms", "must be a non-negative integer (epoch ms)")
    limit = validate_limit(limit)
    after = cursor_check(after, CONVERSATION_CURSOR)
    conversations, cursor = store.conversation_page(tenant, view="all", after=after, limit=limit)
    items: list[BotInbound] = []
    for conversation in conversations:
        if conversation.last_activity_ms < since_ms:
            return items, None  # newest first: every later conversation is older still
        latest = message_latest(tenant, conversation.id, limit=BOT_FEED_WINDOW, store=store)
        # Answered before the bot came (an agent, or a bot's ledger record): an outbound message
        # that is not a bot reply follows it. The bot's own answers are per message (their key).
        answered_until = max(
            (m.timestamp_ms for m in latest if m.direction == "out" and m.source != "bot" and not m.placeholder),
            default=-1,
        )
        inbound = [
            m
            for m in latest
            if m.direction == "in" and m.timestamp_ms >= since_ms and not m.placeholder and not m.dropped
        ]
        for m in inbound[-BOT_FEED_PER_CONVERSATION:]:
            answered = m.timestamp_ms <= answered_until or (
                store.message_get(tenant, bot_reply_id(tenant, conversation.id, bot=bot, in_reply_to=m.id)) is not None
            )
            items.append(BotInbound(m, conversation, answered))
    return items, cursor
