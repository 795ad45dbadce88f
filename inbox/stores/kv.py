"""The inbox store over any DurableKv (ARCHITECTURE §4), through ``TenantKv(kv, "inbox")``.

One table per tenant, ``inbox/<tenant>/conversations``, because a Kv commit is
atomic inside one table only and a projection must write a message, its id
claim and its conversation together. Keys:

=====================================  ===================================================
``k/<sha256(chat key)[:32]>``          the conversation (its Kv version is ``revision``)
``c/<conversation id>``                ``{"k": chat hash}`` — finds a conversation by id
``a/<inverted activity ms>/<conv id>`` a copy of the conversation, newest activity first
``m/<conv id>/<13 digit ms>/<msg id>`` a message (ordered by timestamp, then id)
``i/<message id or alias>``            ``{"c": conv id, "k": sort key}`` — id claims
``p/<provider message id>``            ``{"c": conv id, "k": sort key}``
``n/<conv id>/<note id>``              a note
``r/<conv id>/<agent>``                a read marker
``e/<conv id>``                        an erasure tombstone while a purge runs
=====================================  ===================================================

Chat keys are hashed in keys, so raw chat ids are never part of a key. The
conversation sits under its chat key because projection (the hot path) looks it
up by chat: one read; a lookup by id reads the pointer first.
"""

from __future__ import annotations

from typing import Any

from botmesh_admin.errors import Conflict, NotFound, ValidationError
from botmesh_admin.kv import ABSENT, ANY, Check, ConflictError, Delete, DurableKv, Op, Put, TenantKv
from inbox.domain import Conversation, Message, Note, ReadMarker, chat_hash, now_ms, replace

from .base import INVERT, MAX_SCAN, Change

COLLECTION = "conversations"
RETRIES = 20


def _check_limit(limit: int) -> None:
    if not isinstance(limit, int) or not 1 <= limit <= MAX_SCAN:
        raise ValidationError("limit", f"must be 1..{MAX_SCAN}")


def activity_key(conversation_id: str, last_activity_ms: int) -> str:
    """Return the activity-index key (``activity_cursor``): newest activity sorts first."""
    return f"a/{INVERT - last_activity_ms:013d}/{conversation_id}"


def _stale(what: str, exc: ConflictError) -> Conflict:
    return Conflict(f"{what} changed concurrently", current_version=exc.current_version, key=exc.key)


class KvInboxStore:
    """``InboxStore`` over a DurableKv; safe across threads and processes."""

    def __init__(self, kv: DurableKv) -> None:
        self.kv = kv
        self.tables = TenantKv(kv, "inbox")

    def _table(self, tenant: str) -> str:
        return self.tables.table(tenant, COLLECTION)

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

    def conversation_by_chat(self, tenant: str, chat_key: str) -> Conversation | None:
        entry = self.kv.get(self._table(tenant), f"k/{chat_hash(chat_key)}")
        return None if entry is None else Conversation.from_json(entry.value, entry.version)

    def conversation_page(
        self, tenant: str, *, after: str | None = None, limit: int = 50
    ) -> tuple[list[Conversation], str | None]:
        _check_limit(limit)
        if after is not None and not after.startswith("a/"):
            raise ValidationError("after", "not a cursor of this list")
        table = self._table(tenant)
        entries = self.kv.scan(table, prefix="a/", after=after, limit=limit + 1)
        more = len(entries) > limit
        entries = entries[:limit]
        items: list[Conversation] = []
        for e in entries:
            # The copy's revision is not the conversation's: read it from the copy's data.
            items.append(Conversation.from_json(e.value, int(e.value.get("_revision", 0))))
        return items, (entries[-1].key if more and entries else None)

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
        _check_limit(limit)
        prefix = f"m/{conversation_id}/"
        entries = self.kv.scan(
            self._table(tenant), prefix=prefix, after=None if after is None else prefix + after, limit=limit
        )
        return [Message.from_json(e.value, e.version) for e in entries]

    # -- the atomic write -------------------------------------------------------

    def write(self, tenant: str, change: Change) -> Change:
        table = self._table(tenant)
        ops: dict[str, Op] = {}
        conversation = change.conversation
        conversation_key = None
        if conversation is not None:
            digest = chat_hash(conversation.chat_key)
            conversation_key = f"k/{digest}"
            data = conversation.to_json()
            new_activity = activity_key(conversation.id, conversation.last_activity_ms)
            if conversation.revision == 0:
                ops[conversation_key] = Put(conversation_key, data, ABSENT)
                ops[f"c/{conversation.id}"] = Put(f"c/{conversation.id}", {"k": digest}, ABSENT)
            else:
                previous = change.previous_activity_ms
                if previous is None:
                    old = self.kv.get(table, conversation_key)
                    if old is None or old.version != conversation.revision:
                        raise Conflict(
                            "conversation changed concurrently",
                            current_version=None if old is None else old.version,
                        )
                    previous = old.value["last_activity_ms"]
                ops[conversation_key] = Put(conversation_key, data, conversation.revision)
                old_activity = activity_key(conversation.id, previous)
                if old_activity != new_activity:
                    ops[old_activity] = Delete(old_activity)
            copy = dict(data, _revision=conversation.revision + 1)
            ops[new_activity] = Put(new_activity, copy)
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
        try:
            results = self.kv.commit(table, list(ops.values()))
        except ConflictError as exc:
            raise _stale("inbox record", exc) from None
        # Every Put's result is its written entry (the Deletes' None are never looked up here).
        versions = {op.key: r.version for op, r in zip(ops.values(), results, strict=True) if r is not None}
        new_conversation = None
        if conversation is not None and conversation_key is not None:
            new_conversation = replace(conversation, revision=versions[conversation_key])
        messages = tuple(
            replace(m, revision=versions[f"m/{m.conversation_id}/{m.sort_key}"]) for m in change.messages
        )
        return Change(new_conversation, messages, change.removed, change.aliases)

    # -- notes and markers ------------------------------------------------------

    def _guarded(self, table: str, conversation_id: str, ops: list[Op]) -> list[Any]:
        """Commit ``ops`` only while the conversation exists (retrying if it merely changed)."""
        key = self._conversation_key(table, conversation_id)
        if key is None:
            raise NotFound("conversation not found")
        for _ in range(RETRIES):
            entry = self.kv.get(table, key)
            if entry is None or entry.value.get("id") != conversation_id:
                raise NotFound("conversation not found")
            try:
                return self.kv.commit(table, [*ops, Check(key, entry.version)])
            except ConflictError as exc:
                if exc.key != key:
                    raise _stale("record", exc) from None
        raise Conflict("conversation too busy, try again")

    def note_add(self, tenant: str, note: Note) -> Note:
        key = f"n/{note.conversation_id}/{note.id}"
        self._guarded(self._table(tenant), note.conversation_id, [Put(key, note.to_json(), ABSENT)])
        return note

    def note_page(
        self, tenant: str, conversation_id: str, *, after: str | None = None, limit: int = 50
    ) -> list[Note]:
        _check_limit(limit)
        prefix = f"n/{conversation_id}/"
        entries = self.kv.scan(
            self._table(tenant), prefix=prefix, after=None if after is None else prefix + after, limit=limit
        )
        return [Note.from_json(e.value) for e in entries]

    def marker_get(self, tenant: str, conversation_id: str, agent: str) -> ReadMarker | None:
        entry = self.kv.get(self._table(tenant), f"r/{conversation_id}/{agent}")
        return None if entry is None else ReadMarker.from_json(entry.value, entry.version)

    def marker_put(self, tenant: str, marker: ReadMarker) -> ReadMarker:
        key = f"r/{marker.conversation_id}/{marker.agent}"
        expect = ABSENT if marker.revision == 0 else marker.revision
        results = self._guarded(self._table(tenant), marker.conversation_id, [Put(key, marker.to_json(), expect)])
        return replace(marker, revision=results[0].version)

    # -- erasure ----------------------------------------------------------------

    def conversation_delete(self, tenant: str, conversation: Conversation) -> None:
        table = self._table(tenant)
        key = f"k/{chat_hash(conversation.chat_key)}"
        entry = self.kv.get(table, key)
        if entry is None or entry.value.get("id") != conversation.id:
            raise NotFound("conversation not found")
        if entry.version != conversation.revision:
            raise Conflict("conversation changed concurrently", current_version=entry.version)
        activity = activity_key(conversation.id, entry.value["last_activity_ms"])
        ops: list[Op] = [
            Delete(key, conversation.revision),
            Delete(f"c/{conversation.id}"),
            Delete(activity),
            Put(f"e/{conversation.id}", {"at_ms": now_ms()}),
        ]
        try:
            self.kv.commit(table, ops)
        except ConflictError as exc:
            raise _stale("conversation", exc) from None

    def erasure_pending(self, tenant: str, conversation_id: str) -> bool:
        return self.kv.get(self._table(tenant), f"e/{conversation_id}") is not None

    def conversation_purge(self, tenant: str, conversation_id: str, *, limit: int = 500) -> int:
        _check_limit(limit)
        table = self._table(tenant)
        removed = 0
        for prefix in (f"m/{conversation_id}/", f"n/{conversation_id}/", f"r/{conversation_id}/"):
            while removed < limit:
                entries = self.kv.scan(table, prefix=prefix, limit=min(100, limit - removed))
                if not entries:
                    break
                ops: dict[str, Op] = {}
                for e in entries:
                    ops[e.key] = Delete(e.key)
                    if prefix.startswith("m/"):
                        value = e.value
                        for message_id in (value["id"], *value.get("aliases", ())):
                            ops[f"i/{message_id}"] = Delete(f"i/{message_id}")
                        if value.get("provider_message_id"):
                            pid = value["provider_message_id"]
                            pointer = self.kv.get(table, f"p/{pid}")
                            if pointer is not None and pointer.value.get("c") == conversation_id:
                                ops[f"p/{pid}"] = Delete(f"p/{pid}", pointer.version)
                try:
                    self.kv.commit(table, list(ops.values()))
                except ConflictError:
                    continue  # a provider index moved meanwhile; scan again
                removed += len(entries)
        if removed == 0:
            self.kv.commit(table, [Delete(f"e/{conversation_id}")])
        return removed
