"""``BOTMESH_CAMPAIGN_LEASE_MS`` is the lease of a campaign run's journal event (``campaigns-run``).

Regression (session 7 review): the setting was accepted and documented but never read; every drain leased 30 s.
A real drain (``journal_drain``) over a journal on a fake clock: the run's record is leased for the setting's
milliseconds, another channel's for 30 s, and an explicit ``lease_ms`` (``--lease-ms``) still wins.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import override_settings

from botmesh_admin.clock import FakeClock, use_clock
from botmesh_admin.events import Envelope, EventRecord, connect_journal, use_journal
from botmesh_admin.events.handlers import register, unregister
from botmesh_admin.events.services import journal_drain, worker_for

NOW = 1_800_000_000_000


@pytest.fixture
def leases() -> Iterator[list[int]]:
    """``test.lease``: a handler that records for how long (ms) its record is leased."""
    seen: list[int] = []

    @register("test.lease")
    def handle(record: EventRecord) -> None:
        seen.append((record.leased_until or 0) - NOW)

    yield seen
    unregister("test.lease")


def test_a_campaign_run_is_leased_for_botmesh_campaign_lease_ms_and_other_channels_for_30_s(
    leases: list[int],
) -> None:
    clock = FakeClock(NOW)
    with use_clock(clock), use_journal(connect_journal("memory://", clock=clock)) as journal:
        for channel in ("campaigns-run", "outbox"):
            journal.append(
                Envelope(type="test.lease", tenant="acme", payload={}, idempotency_key=channel, channel=channel)
            )
        with override_settings(BOTMESH_CAMPAIGN_LEASE_MS=7_000):
            assert journal_drain(channel="campaigns-run")["processed"] == 1
            assert journal_drain(channel="outbox")["processed"] == 1
            assert worker_for("campaigns-run", lease_ms=2_000).lease_ms == 2_000  # --lease-ms still wins
    assert leases == [7_000, 30_000]
