"""Conversation events (issue 20, item 8) over every store: written with the change that makes them,
listed in time order by who did them, refused with a bad actor, erased with the conversation."""

from __future__ import annotations

import pytest

from botmesh_admin.clock import now_ms
from botmesh_admin.errors import ValidationError
from inbox import selectors
from inbox.services import (
    conversation_assign,
    conversation_erase,
    conversation_handoff,
    conversation_status_set,
    conversations_wake,
)

from .test_services import seeded

pytestmark = pytest.mark.django_db


def test_changes_are_recorded_as_events_by_who_made_them_in_time_order(inbox, tenant_id):
    cid = seeded(inbox, tenant_id, n_in=2, n_out=1)
    version = inbox.conversation_get(tenant_id, cid).version
    conversation_assign(tenant_id, cid, agent="mateo", expected_version=version, actor="ana")
    conversation_handoff(tenant_id, cid, active=True, actor="mateo")
    conversation_status_set(tenant_id, cid, status="resolved", actor="mateo")
    conversation_status_set(tenant_id, cid, status="resolved", actor="mateo")  # no change: no event
    conversation_handoff(tenant_id, cid, active=False, actor="ana")
    version = inbox.conversation_get(tenant_id, cid).version
    conversation_assign(tenant_id, cid, agent=None, expected_version=version, actor="ana")
    events = selectors.event_list(tenant_id, cid, store=inbox)
    assert [(e.kind, e.actor, e.value) for e in events] == [
        ("assigned", "ana", "mateo"),
        ("handoff_taken", "mateo", None),
        ("status", "mateo", "resolved"),
        ("handoff_released", "ana", None),
        ("unassigned", "ana", None),
    ]
    assert [e.at_ms for e in events] == sorted(e.at_ms for e in events)
    later = selectors.event_list(tenant_id, cid, since_ms=events[-1].at_ms, store=inbox)
    assert events[-1] in later and all(e.at_ms >= events[-1].at_ms for e in later)


def test_a_bad_actor_is_refused_and_nothing_is_written(inbox, tenant_id):
    cid = seeded(inbox, tenant_id, n_in=1, n_out=0)
    before = inbox.conversation_get(tenant_id, cid)
    with pytest.raises(ValidationError, match="actor"):
        conversation_status_set(tenant_id, cid, status="resolved", actor="not a name!")
    assert inbox.conversation_get(tenant_id, cid).status == before.status
    assert selectors.event_list(tenant_id, cid, store=inbox) == []


def test_the_wake_up_job_reopens_as_the_system(inbox, tenant_id):
    cid = seeded(inbox, tenant_id, n_in=1, n_out=0)
    now = now_ms()
    conversation_status_set(tenant_id, cid, status="pending", snoozed_until_ms=now + 1000, actor="ana")
    assert conversations_wake(tenant_id, at_ms=now + 2000) == 1
    events = selectors.event_list(tenant_id, cid, store=inbox)
    assert [(e.kind, e.actor, e.value) for e in events] == [("status", "ana", "pending"), ("status", None, "open")]


def test_erasure_removes_the_events(inbox, tenant_id):
    cid = seeded(inbox, tenant_id, n_in=1, n_out=0)
    conversation_handoff(tenant_id, cid, active=True, actor="ana")
    removed = conversation_erase(tenant_id, cid)
    assert removed == 1 + 1 + 2  # the conversation, its message, its events (taken from the bot, assigned)
    assert inbox.event_page(tenant_id, cid) == []
