"""Inbox fixtures: the store contract over the memory store and the Kv store on every backend."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from botmesh_admin.demo import fixtures_dir
from inbox.stores import use_store
from inbox.stores.base import InboxStore
from inbox.stores.kv import KvInboxStore
from inbox.stores.memory import MemoryInboxStore
from tests import stores
from tests.stores import store_fixture

inbox_store = store_fixture("inbox_store", memory=MemoryInboxStore, kv=KvInboxStore)


def open_store(kind: str, request: pytest.FixtureRequest) -> InboxStore:
    """Return a fresh inbox store of ``kind``: ``memory`` or ``kv-<backend>`` (``tests.stores``)."""
    return stores.open_store(kind, request, memory=MemoryInboxStore, kv=KvInboxStore)


@pytest.fixture
def inbox(inbox_store: InboxStore) -> Iterator[InboxStore]:
    """Each store in turn as the services' default (``use_store``): the services act on it."""
    with use_store(inbox_store):
        yield inbox_store


@pytest.fixture
def default_inbox_store():
    """Make a fresh memory store the services' default for the test."""
    store = MemoryInboxStore()
    with use_store(store):
        yield store


def ledger_records() -> list[dict]:
    """The shared ledger fixture, one dict per line (602 lines)."""
    path = fixtures_dir() / "ledger" / "messages.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
