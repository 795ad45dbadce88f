"""The reference inbox store: plain dicts under one lock (one process)."""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field

from botmesh_admin.errors import NotFound
from botmesh_admin.pagination import validate_limit
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
    replace,
)

from .base import MAX_SCAN, STATUSES, Change, StaleRevision, parse_cursor, unread_candidates_by_page


@dataclass
class _Tenant:
    conversations: dict[str, Conversation] = field(default_factory=dict)
    chats: dict[str, str] = field(default_factory=dict)
    messages: dict[str, dict[str, Message]] = field(default_factory=lambda: defaultdict(dict))
    ids: dict[str, tuple[str, str]] = field(default_factory=dict)
    provider_ids: dict[str, tuple[str, str]] = field(default_factory=dict)
    notes: dict[str, dict[str, Note]] = field(default_factory=lambda: defaultdict(dict))
    events: dict[str, dict[str, ConversationEvent]] = field(default_factory=lambda: defaultdict(dict))
    markers: dict[tuple[str, str], ReadMarker] = field(default_factory=dict)
    tombstones: set[str] = field(default_factory=set)


def _order(c: Conversation) -> tuple[int, str]:
    """Return a conversation's place in the lists: newest activity first, then by chat key hash."""
    return (-c.last_activity_ms, chat_hash(c.identity))


def _in_view(c: Conversation, view: str, agent: str | None) -> bool:
    return view == "all" or c.assignee == (agent if view == "mine" else None)


class MemoryInboxStore:
    """``InboxStore`` in memory; thread-safe, not shared between processes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tenants: dict[str, _Tenant] = defaultdict(_Tenant)
        self._settings: dict[str, InboxSettings] = {}

    def conversation_get(self, tenant: str, conversation_id: str) -> Conversation | None:
        with self._lock:
            return self._tenants[tenant].conversations.get(conversation_id)

    def conversation_by_chat(
        self, tenant: str, chat_key: str, *, channel_name: str | None = None
    ) -> Conversation | None:
        with self._lock:
            t = self._tenants[tenant]
            if channel_name is not None:
                cid = t.chats.get(chat_hash(conversation_identity(chat_key, channel_name)))
                if cid is not None:
                    return t.conversations.get(cid)
            cid = t.chats.get(chat_hash(chat_key))
            legacy = None if cid is None else t.conversations.get(cid)
            if legacy is not None and channel_name is not None and legacy.channel_name not in (None, channel_name):
                return None
            return legacy

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
        with self._lock:
            t = self._tenants[tenant]
            ordered = sorted(
                (
                    c
                    for c in t.conversations.values()
                    if _in_view(c, view, agent)
                    and status in (None, c.status)
                    and channel in (None, c.channel)
                    and channel_name in (None, c.channel_name)
                    and contact_id in (None, c.contact_id)
                ),
                key=_order,
            )
            if after is not None:
                at, conversation_id = parse_cursor(after)
                known = t.conversations.get(conversation_id)
                # A conversation gone since: resume at the start of its millisecond (as the Kv store).
                start = (-at, chat_hash(known.chat_key) if known is not None else "")
                ordered = [c for c in ordered if _order(c) > start]
        page = ordered[:limit]
        more = len(ordered) > limit
        return page, (f"{page[-1].last_activity_ms}/{page[-1].id}" if more and page else None)

    def _seen(self, t: _Tenant, conversation_id: str, key: str) -> int:
        """Return how many inbound messages of the conversation sort at or before ``key`` (the definition)."""
        messages = t.messages.get(conversation_id, {})
        return sum(1 for k, m in messages.items() if k <= key and m.direction == "in")

    def _marker(self, t: _Tenant, conversation_id: str, agent: str) -> ReadMarker | None:
        marker = t.markers.get((conversation_id, agent))
        if marker is None or conversation_id not in t.conversations:
            return None  # an erased conversation's markers wait for the purge, out of sight
        return replace(marker, seen_inbound=self._seen(t, conversation_id, marker.message_sort_key))

    def _unread(self, t: _Tenant, c: Conversation, agent: str) -> int:
        marker = self._marker(t, c.id, agent)
        seen = 0 if marker is None else marker.seen_inbound or 0
        return c.inbound_count - seen

    def conversation_counts(self, tenant: str, *, agent: str) -> dict[str, dict[str, int]]:
        with self._lock:
            conversations = list(self._tenants[tenant].conversations.values())
        return {
            view: {s: sum(1 for c in conversations if _in_view(c, view, agent) and c.status == s) for s in STATUSES}
            for view in ("all", "mine", "unassigned")
        }

    def unread_sum(self, tenant: str, *, agent: str, view: str = "all") -> int | None:
        with self._lock:
            t = self._tenants[tenant]
            return sum(self._unread(t, c, agent) for c in t.conversations.values() if _in_view(c, view, agent))

    def snoozed_due(self, tenant: str, *, now_ms: int, limit: int = 200) -> list[Conversation]:
        validate_limit(limit, maximum=MAX_SCAN)
        with self._lock:
            due = [
                c
                for c in self._tenants[tenant].conversations.values()
                if c.status == "pending" and c.snoozed_until_ms is not None and c.snoozed_until_ms <= now_ms
            ]
        return sorted(due, key=lambda c: (c.snoozed_until_ms or 0, chat_hash(c.chat_key)))[:limit]

    def markers_backfill(self, tenant: str, *, limit: int = 200) -> int:
        validate_limit(limit, maximum=MAX_SCAN)
        return 0  # this store computes seen_inbound when it reads a marker

    def _at(self, t: _Tenant, pointer: tuple[str, str] | None) -> Message | None:
        return None if pointer is None else t.messages.get(pointer[0], {}).get(pointer[1])

    def message_get(self, tenant: str, message_id: str) -> Message | None:
        with self._lock:
            t = self._tenants[tenant]
            return self._at(t, t.ids.get(message_id))

    def message_by_provider_id(self, tenant: str, provider_message_id: str) -> Message | None:
        with self._lock:
            t = self._tenants[tenant]
            return self._at(t, t.provider_ids.get(provider_message_id))

    def message_page(
        self, tenant: str, conversation_id: str, *, after: str | None = None, limit: int = 100
    ) -> list[Message]:
        validate_limit(limit, maximum=MAX_SCAN)
        with self._lock:
            messages = self._tenants[tenant].messages.get(conversation_id, {})
            keys = sorted(k for k in messages if after is None or k > after)[:limit]
            return [messages[k] for k in keys]

    def write(self, tenant: str, change: Change) -> Change:
        with self._lock:
            t = self._tenants[tenant]
            self._check(t, change)
            new_conversation = None
            if change.conversation is not None:
                c = change.conversation
                new_conversation = replace(c, revision=c.revision + 1)
                t.conversations[c.id] = new_conversation
                t.chats[chat_hash(c.identity)] = c.id
            for m in change.removed:
                del t.messages[m.conversation_id][m.sort_key]
                for message_id in (m.id, *m.aliases):
                    t.ids.pop(message_id, None)
                if m.provider_message_id:
                    t.provider_ids.pop(m.provider_message_id, None)
            messages = []
            for m in change.messages:
                stored = replace(m, revision=m.revision + 1)
                t.messages[m.conversation_id][m.sort_key] = stored
                for message_id in (m.id, *m.aliases) if m.revision == 0 else (m.id,):
                    t.ids[message_id] = (m.conversation_id, m.sort_key)
                if m.provider_message_id:
                    t.provider_ids[m.provider_message_id] = (m.conversation_id, m.sort_key)
                messages.append(stored)
            for alias, m in change.aliases:
                t.ids[alias] = (m.conversation_id, m.sort_key)
            for e in change.events:
                t.events[e.conversation_id][e.id] = e
            return Change(new_conversation, tuple(messages), change.removed, change.aliases, events=change.events)

    def _check(self, t: _Tenant, change: Change) -> None:
        c = change.conversation
        if c is not None:
            current = t.conversations.get(c.id)
            revision = 0 if current is None else current.revision
            if revision != c.revision:
                raise StaleRevision("conversation changed concurrently", current_version=revision or None)
            if c.revision == 0 and chat_hash(c.identity) in t.chats:
                raise StaleRevision("chat key already has a conversation")
        for m in change.removed:
            stored = t.messages.get(m.conversation_id, {}).get(m.sort_key)
            if stored is None or stored.revision != m.revision:
                raise StaleRevision("message changed concurrently")
        removed_ids = {i for m in change.removed for i in (m.id, *m.aliases)}
        for m in change.messages:
            stored = t.messages.get(m.conversation_id, {}).get(m.sort_key)
            if stored is not None and any(r.sort_key == m.sort_key for r in change.removed):
                stored = None
            revision = 0 if stored is None else stored.revision
            if revision != m.revision:
                raise StaleRevision("message changed concurrently", current_version=revision or None)
            for message_id in (m.id, *m.aliases) if m.revision == 0 else ():
                if message_id in t.ids and message_id not in removed_ids:
                    raise StaleRevision(f"message id {message_id!r} already exists")
        for alias, _ in change.aliases:
            if alias in t.ids and alias not in removed_ids:
                raise StaleRevision(f"message id {alias!r} already exists")
        for e in change.events:
            if e.id in t.events.get(e.conversation_id, {}):
                raise StaleRevision(f"event {e.id!r} already exists")

    def _require(self, t: _Tenant, conversation_id: str) -> None:
        if conversation_id not in t.conversations:
            raise NotFound("conversation not found")

    def note_add(self, tenant: str, note: Note) -> Note:
        with self._lock:
            t = self._tenants[tenant]
            self._require(t, note.conversation_id)
            if note.id in t.notes[note.conversation_id]:
                raise StaleRevision(f"note {note.id!r} already exists")
            t.notes[note.conversation_id][note.id] = note
            return note

    def note_page(self, tenant: str, conversation_id: str, *, after: str | None = None, limit: int = 50) -> list[Note]:
        validate_limit(limit, maximum=MAX_SCAN)
        with self._lock:
            notes = self._tenants[tenant].notes.get(conversation_id, {})
            return [notes[k] for k in sorted(k for k in notes if after is None or k > after)[:limit]]

    def conversation_search_scan(
        self, tenant: str, prefix: str, *, after: tuple[str, str] | None = None, limit: int = 200
    ) -> list[tuple[str, Conversation]]:
        validate_limit(limit, maximum=MAX_SCAN)
        with self._lock:
            conversations = list(self._tenants[tenant].conversations.values())
        hits = sorted(
            ((key, chat_hash(c.identity)), c)
            for c in conversations
            for key in conversation_search_keys(c.display_name, c.chat_key)
            if key.startswith(prefix)
        )
        position = None
        if after is not None:
            found = next((c for c in conversations if c.id == after[1]), None)
            position = (after[0], chat_hash(found.identity) if found is not None else "")
        return [(key, c) for (key, h), c in hits if position is None or (key, h) > position][:limit]

    def event_page(
        self, tenant: str, conversation_id: str, *, after: str | None = None, limit: int = 50
    ) -> list[ConversationEvent]:
        validate_limit(limit, maximum=MAX_SCAN)
        with self._lock:
            events = self._tenants[tenant].events.get(conversation_id, {})
            return [events[k] for k in sorted(k for k in events if after is None or k > after)[:limit]]

    def marker_get(self, tenant: str, conversation_id: str, agent: str) -> ReadMarker | None:
        with self._lock:
            return self._marker(self._tenants[tenant], conversation_id, agent)

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
        return unread_candidates_by_page(
            self, tenant, agent=agent, view=view, status=status, channel=channel, after=after, limit=limit
        )

    def markers_get(self, tenant: str, conversation_ids: list[str], agent: str) -> list[ReadMarker | None]:
        with self._lock:
            t = self._tenants[tenant]
            return [self._marker(t, cid, agent) for cid in conversation_ids]

    def marker_put(self, tenant: str, marker: ReadMarker) -> ReadMarker:
        with self._lock:
            t = self._tenants[tenant]
            self._require(t, marker.conversation_id)
            current = t.markers.get((marker.conversation_id, marker.agent))
            revision = 0 if current is None else current.revision
            if revision != marker.revision:
                raise StaleRevision("read marker changed concurrently", current_version=revision or None)
            stored = replace(marker, revision=revision + 1, seen_inbound=None)
            t.markers[(marker.conversation_id, marker.agent)] = stored
            return replace(stored, seen_inbound=self._seen(t, marker.conversation_id, marker.message_sort_key))

    def conversation_delete(self, tenant: str, conversation: Conversation) -> None:
        with self._lock:
            t = self._tenants[tenant]
            current = t.conversations.get(conversation.id)
            if current is None:
                raise NotFound("conversation not found")
            if current.revision != conversation.revision:
                raise StaleRevision("conversation changed concurrently", current_version=current.revision)
            del t.conversations[conversation.id]
            t.chats.pop(chat_hash(current.identity), None)
            t.tombstones.add(conversation.id)

    def erasure_pending(self, tenant: str, conversation_id: str) -> bool:
        with self._lock:
            return conversation_id in self._tenants[tenant].tombstones

    def conversation_purge(self, tenant: str, conversation_id: str, *, limit: int = 500) -> int:
        validate_limit(limit, maximum=MAX_SCAN)
        with self._lock:
            t = self._tenants[tenant]
            removed = 0
            messages = t.messages.get(conversation_id, {})
            for key in sorted(messages)[:limit]:
                m = messages.pop(key)
                for message_id in (m.id, *m.aliases):
                    t.ids.pop(message_id, None)
                if m.provider_message_id and t.provider_ids.get(m.provider_message_id, ("",))[0] == conversation_id:
                    del t.provider_ids[m.provider_message_id]
                removed += 1
            notes = t.notes.get(conversation_id, {})
            for key in sorted(notes)[: limit - removed]:
                del notes[key]
                removed += 1
            events = t.events.get(conversation_id, {})
            for key in sorted(events)[: max(limit - removed, 0)]:
                del events[key]
                removed += 1
            for marker_key in [k for k in t.markers if k[0] == conversation_id][: max(limit - removed, 0)]:
                del t.markers[marker_key]
                removed += 1
            if removed == 0:
                t.tombstones.discard(conversation_id)
                t.messages.pop(conversation_id, None)
                t.notes.pop(conversation_id, None)
                t.events.pop(conversation_id, None)
            return removed

    def settings_get(self, tenant: str) -> InboxSettings:
        with self._lock:
            return self._settings.get(tenant) or InboxSettings()

    def settings_put(self, tenant: str, settings: InboxSettings) -> InboxSettings:
        with self._lock:
            current = self._settings.get(tenant)
            if (current.revision if current else 0) != settings.revision:
                raise StaleRevision(
                    "inbox settings changed concurrently", current_version=current.revision if current else 0
                )
            stored = replace(settings, revision=settings.revision + 1)
            self._settings[tenant] = stored
            return stored
