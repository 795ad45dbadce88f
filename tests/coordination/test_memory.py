"""MemoryCoordinationHub specifics: LRU eviction of idle keys."""

from __future__ import annotations

import pytest

from botmesh_admin.coordination.memory import MemoryCoordinationHub, MemoryCoordinator
from botmesh_admin.errors import ValidationError


def test_idle_keys_are_evicted_least_recently_used_first() -> None:
    """Beyond max_idle_keys the oldest idle key goes; fences stay monotonic; a recreated key has no history."""
    hub = MemoryCoordinationHub(max_idle_keys=3)
    a = MemoryCoordinator(hub, "a", lease_ms=5000)
    fences = []
    for key in ("k1", "k2", "k3"):
        turn = a.acquire_turn(key, 0)
        fences.append(turn.fence)
        turn.release()
    recent = a.acquire_turn("k1", 0)  # k1 is now the most recently used
    assert recent.previous_holder == a.owner
    recent.release()
    turn = a.acquire_turn("k4", 0)  # evicts k2, the least recently used idle key
    turn.release()
    assert len(hub) == 3
    again = a.acquire_turn("k1", 0)
    assert again.previous_holder == a.owner  # k1 survived
    again.release()
    recreated = a.acquire_turn("k2", 0)
    assert recreated.previous_holder is None  # k2 was evicted: no memory of its holder
    assert recreated.fence > max(fences + [again.fence])
    a.close()


def test_busy_keys_are_never_evicted() -> None:
    """A key with a live holder survives any number of newer keys."""
    hub = MemoryCoordinationHub(max_idle_keys=2)
    a, b = MemoryCoordinator(hub, "a", lease_ms=5000), MemoryCoordinator(hub, "b", lease_ms=5000)
    held = a.acquire_turn("busy", 0)
    for i in range(50):
        a.acquire_turn(f"idle-{i}", 0).release()
    assert len(hub) <= 3
    assert b.acquire_turn("busy", 0) is None and held.valid()
    a.close()
    b.close()


def test_max_idle_keys_must_be_positive() -> None:
    with pytest.raises(ValidationError):
        MemoryCoordinationHub(max_idle_keys=0)


def test_a_bots_prefix_is_stable_valid_and_its_own() -> None:
    import hashlib

    import pytest

    from botmesh_admin.coordination import bot_prefix
    from botmesh_admin.coordination.base import PREFIX_RE
    from botmesh_admin.errors import ValidationError

    long_tenant, bot = "t" * 63, "tienda-bot/🤖 v2"
    prefix = bot_prefix(long_tenant, bot)
    assert prefix == "bot-" + hashlib.sha256(f"{long_tenant}/{bot}".encode()).hexdigest()[:20]
    assert PREFIX_RE.fullmatch(prefix) and prefix == bot_prefix(long_tenant, bot)
    assert bot_prefix("tienda", "tienda-bot") != bot_prefix("soporte", "tienda-bot")
    with pytest.raises(ValidationError) as err:
        bot_prefix("tienda", "")
    assert err.value.field == "bot"
