"""A malformed heartbeat (a bot process in any language writes it) never takes the Replicas page down (review fix).

It was ``int(info["pid"])`` / ``dict(info["leads"])`` in ``replica_status_from_info``: one bad
entry made the page and the API 500 for every bot of the tenant. Now the bad fields read as
unknown and the row says "unreadable heartbeat"; the good replicas show as before.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from botmesh_admin.coordination.base import bot_prefix
from botmesh_admin.coordination.bots import use_bot_backends
from botmesh_admin.coordination.kv import KvBackend
from botmesh_admin.coordination.memory import MemoryCoordinationHub
from botmesh_admin.kv import Put
from botmesh_admin.kv.memory import MemoryKv

from .conftest import client_for
from .test_bot_replicas import _api, _push

pytestmark = pytest.mark.usefixtures("members", "isolated", "web")

GOOD = {
    "replica_id": "good-1",
    "incarnation": "i1",
    "role": "bot",
    "host": "h1",
    "pid": 4242,
    "turns": 0,
    "turn_keys": [],
    "leads": {"scheduler": 3},
    "lease_ms": 60_000,
}
BAD = {**GOOD, "replica_id": "bad-1", "pid": "12a", "leads": [1, 2], "turns": {"n": 1}, "turn_keys": "x"}


@pytest.fixture(params=["memory", "kv"])
def backend(request) -> Iterator[object]:  # type: ignore[no-untyped-def]
    """The bot prefix's backend: an in-process hub, or a ``KvBackend`` over a Kv."""
    backends: dict[str, object] = {}
    kv = MemoryKv("memory://")

    def make(prefix: str) -> object:
        if prefix not in backends:
            backends[prefix] = MemoryCoordinationHub() if request.param == "memory" else KvBackend(kv, prefix)
        return backends[prefix]

    with use_bot_backends(make):  # type: ignore[arg-type]
        yield make(bot_prefix("tienda", "tienda-bot"))


def test_a_malformed_heartbeat_shows_as_unreadable_and_the_good_replicas_still_show(backend) -> None:  # type: ignore[no-untyped-def]
    _push("tienda", "tienda-bot", "good-1")
    _push("tienda", "tienda-bot", "bad-1")
    backend.heartbeat("good-1/i1", GOOD)
    backend.heartbeat("bad-1/i1", BAD)
    if isinstance(backend, KvBackend):  # a value that is no JSON object at all, one with a bad beat_ms: skipped
        backend.kv.commit(backend.table, [Put("r/junk/i1", [1, 2, 3], ttl_ms=60_000)])
        backend.kv.commit(backend.table, [Put("r/junk/i2", {**GOOD, "replica_id": "j2", "beat_ms": "x"})])
    response = client_for("bob").get("/t/tienda/replicas/")
    assert response.status_code == 200
    html = response.content.decode()
    good = html.split('data-bot-replica="good-1"')[1].split("</tr>")[0]
    assert "h1 / 4242" in good and "unreadable" not in good
    bad = html.split('data-bot-replica="bad-1"')[1].split("</tr>")[0]
    assert "unreadable heartbeat (pid, turns, leads, turn_keys)" in bad and "h1 / 0" in bad
    for path in ("replicas", "bots/tienda-bot/replicas"):
        answer = _api("tienda").get(f"/api/v1/tenants/tienda/{path}")
        assert answer.status_code == 200, answer.content
        body = answer.json()
        replicas = (body["bots"][0] if "bots" in body else body)["replicas"]
        by_id = {r["replica_id"]: r for r in replicas}
        assert by_id["good-1"]["pid"] == 4242 and by_id["good-1"]["unreadable"] == []
        assert by_id["bad-1"]["unreadable"] == ["pid", "turns", "leads", "turn_keys"] and by_id["bad-1"]["pid"] == 0
        assert set(by_id) == {"good-1", "bad-1"}
