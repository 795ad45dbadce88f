"""Parsers never raise on any JSON object: a webhook is never lost to a shape the provider adds later.

The one refusal: a message time that is not a plausible Unix time (never stored as 1970).
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from botmesh_admin.channels import telegram, whatsapp
from botmesh_admin.channels.domain import event_from_json
from botmesh_admin.errors import ValidationError

from .conftest import telegram_updates, whatsapp_bodies

KEYS = st.sampled_from(
    [
        "entry",
        "changes",
        "value",
        "messages",
        "statuses",
        "contacts",
        "metadata",
        "from",
        "id",
        "type",
        "text",
        "body",
        "image",
        "interactive",
        "button_reply",
        "reaction",
        "location",
        "latitude",
        "longitude",
        "errors",
        "code",
        "timestamp",
        "message",
        "edited_message",
        "callback_query",
        "my_chat_member",
        "chat",
        "photo",
        "file_id",
        "data",
        "new_chat_member",
        "status",
        "date",
        "message_id",
        "update_id",
        "caption",
        "context",
    ]
)
SCALARS = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=8)
JSON = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=5), max_leaves=12
)


WHATSAPP = sorted(whatsapp_bodies().items())
TELEGRAM = sorted(telegram_updates().items())


def mutate(base: dict, data) -> dict:
    """Replace one random node of a real fixture with random JSON."""
    doc = json.loads(json.dumps(base))
    node = doc
    for _ in range(data.draw(st.integers(0, 6))):
        children = (
            list(node.items()) if isinstance(node, dict) else list(enumerate(node)) if isinstance(node, list) else []
        )
        containers = [(k, v) for k, v in children if isinstance(v, dict | list)]
        if not containers:
            break
        key, child = data.draw(st.sampled_from(containers))
        if data.draw(st.booleans()):
            node[key] = data.draw(JSON)
            break
        node = child
    return doc


def parsed(parse, doc) -> list:  # type: ignore[no-untyped-def]
    """Return ``parse(doc)``, or no events if the parser refused an unreadable time (the only refusal)."""
    try:
        return parse(doc)
    except ValidationError as exc:
        assert (exc.field or "").endswith(("timestamp", "date")), exc
        return []


def round_trips(events: list) -> None:
    for event in events:
        assert event_from_json(json.loads(json.dumps(event.to_json()))) == event


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_whatsapp_parser_survives_any_change(data) -> None:
    base = data.draw(st.sampled_from(WHATSAPP))[1]
    round_trips(parsed(whatsapp.parse_webhook, mutate(base, data)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_telegram_parser_survives_any_change(data) -> None:
    base = data.draw(st.sampled_from(TELEGRAM))[1]
    round_trips(parsed(lambda doc: telegram.parse_update(doc, now_ms=1), mutate(base, data)))


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(KEYS, JSON, max_size=6))
def test_random_objects_parse_without_raising(doc) -> None:
    round_trips(parsed(whatsapp.parse_webhook, doc))
    round_trips(parsed(lambda d: telegram.parse_update(d, now_ms=1), doc))
