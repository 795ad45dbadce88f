"""Inbox writes (every one of them): the public actions, re-exported from the sub-modules.

- ``conversations``: assignment, handoff, status, notes, read markers, erasure,
  settings, the periodic tick and the bot ledger push;
- ``projection``: ledger records and channel events become conversations and messages;
- ``replies``: agents' and bots' replies through the outbox.

``from inbox.services import conversation_assign`` is the way in; the sub-modules
are named for the reader looking for where a write happens.
"""

from ..domain import TICK_EVERY_S
from .conversations import (
    INBOUND_CHANNEL,
    LEDGER_CHANNEL,
    LEDGER_EVENT,
    MAX_LEDGER_RECORDS,
    conversation_assign,
    conversation_channels_assign,
    conversation_erase,
    conversation_handoff,
    conversation_status_set,
    conversations_wake,
    event_project,
    inbox_settings_set,
    inbox_tick,
    ledger_parse,
    ledger_push,
    message_project,
    note_add,
    read_marker_set,
    read_markers_backfill,
)
from .projection import Projected, after_projection, prefetch_contacts, project_batched
from .replies import HandedOff, bot_reply_create, reply_create, reply_resend, reply_send

__all__ = [
    "INBOUND_CHANNEL",
    "LEDGER_CHANNEL",
    "LEDGER_EVENT",
    "MAX_LEDGER_RECORDS",
    "TICK_EVERY_S",
    "HandedOff",
    "Projected",
    "bot_reply_create",
    "conversation_assign",
    "conversation_channels_assign",
    "conversation_erase",
    "conversation_handoff",
    "conversation_status_set",
    "conversations_wake",
    "event_project",
    "inbox_settings_set",
    "inbox_tick",
    "ledger_parse",
    "ledger_push",
    "message_project",
    "note_add",
    "after_projection",
    "prefetch_contacts",
    "project_batched",
    "read_marker_set",
    "read_markers_backfill",
    "reply_create",
    "reply_resend",
    "reply_send",
]
