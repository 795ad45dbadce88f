"""Hypothesis stateful test: every backend behaves exactly like the memory reference journal.

Random sequences of append / claim / ack / fail / release / replay / prune /
clock moves, and their batched forms (append_many, claim_many, ack_many,
fail_many), run against a backend and a ``MemoryEventJournal`` side by side,
with the same clock and a jitter-free policy; every answer (record or error
class) and every listing, filtered and paged, must be equal — fencing tokens
included.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from botmesh_admin.errors import DomainError
from botmesh_admin.events import Envelope, RetryPolicy, connect_journal
from botmesh_admin.events.memory import MemoryEventJournal

from . import journals
from .conftest import FakeClock, backend_params

TENANTS = ("acme", "beta")
CHANNELS = (None, "inbound")


def outcome(call):  # type: ignore[no-untyped-def]
    """Return the call's value, or the class name of the domain error it raised."""
    try:
        return call()
    except DomainError as exc:
        return type(exc).__name__


@pytest.mark.parametrize("backend", backend_params(("file", "sqlite", "postgresql", "redis")))
def test_backend_matches_the_memory_reference(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    servers = {"postgresql": "postgres_url", "redis": "redis_url"}
    server = request.getfixturevalue(servers[backend]) if backend in servers else None
    counter = iter(range(10**6))

    def fresh_url() -> str:
        n = next(counter)
        if backend == "file":
            return f"file://{tmp_path}/j{n}.json"
        if backend == "sqlite":
            return f"sqlite:///{tmp_path}/j{n}.sqlite3"
        return journals.with_namespace(server)  # type: ignore[arg-type]

    class JournalMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.clock = FakeClock()
            self.url = fresh_url()
            policy = RetryPolicy(max_attempts=2, base_delay_ms=100, max_delay_ms=1000, jitter=0.0)
            self.real = connect_journal(self.url, policy=policy, clock=self.clock)
            self.model = MemoryEventJournal(policy=policy, clock=self.clock)
            self.tokens: dict[str, int] = {}  # event id -> latest token handed out

        def teardown(self) -> None:
            self.real.close()
            journals.drop(self.url)

        def both(self, op):  # type: ignore[no-untyped-def]
            expected, actual = outcome(lambda: op(self.model)), outcome(lambda: op(self.real))
            assert actual == expected
            return expected

        @rule(
            tenant=st.sampled_from(TENANTS),
            key=st.integers(0, 5),
            channel=st.sampled_from(CHANNELS),
            id_number=st.integers(0, 6),
        )
        def append(self, tenant: str, key: int, channel: str | None, id_number: int) -> None:
            envelope = Envelope(
                type="test.event", tenant=tenant, payload={"k": key}, idempotency_key=f"k{key}",
                channel=channel, id=f"ev{id_number}",
            )  # fmt: skip
            self.both(lambda j: j.append(envelope))

        @rule(channel=st.sampled_from(CHANNELS), lease=st.sampled_from((50, 500)))
        def claim(self, channel: str | None, lease: int) -> None:
            record = self.both(lambda j: j.claim(self.clock.now, lease, channel))
            if record is not None and not isinstance(record, str):
                self.tokens[record.id] = record.fencing_token

        @rule(
            data=st.data(),
            action=st.sampled_from(("ack", "fail", "release", "extend")),
            offset=st.sampled_from((0, 0, -1)),
        )
        def settle(self, data: st.DataObject, action: str, offset: int) -> None:
            if not self.tokens:
                return
            event_id = data.draw(st.sampled_from(sorted(self.tokens)))
            token = max(self.tokens[event_id] + offset, 1)
            now = self.clock.now
            if action == "ack":
                self.both(lambda j: j.ack(event_id, now, token))
            elif action == "fail":
                self.both(lambda j: j.fail(event_id, now, token, "boom"))
            elif action == "extend":
                self.both(lambda j: j.extend(event_id, now, token, 500))
            else:
                self.both(lambda j: j.release(event_id, now, token))

        @rule(
            batch=st.lists(
                st.tuples(st.sampled_from(TENANTS), st.integers(0, 5), st.sampled_from(CHANNELS), st.integers(0, 6)),
                max_size=4,
            )
        )
        def append_many(self, batch: list[tuple[str, int, str | None, int]]) -> None:
            envelopes = [
                Envelope(
                    type="test.event",
                    tenant=tenant,
                    payload={"k": key},
                    idempotency_key=f"k{key}",
                    channel=channel,
                    id=f"ev{id_number}",
                )  # fmt: skip
                for tenant, key, channel, id_number in batch
            ]
            self.both(lambda j: j.append_many(envelopes))

        @rule(channel=st.sampled_from(CHANNELS), lease=st.sampled_from((50, 500)), limit=st.sampled_from((1, 2, 5)))
        def claim_many(self, channel: str | None, lease: int, limit: int) -> None:
            records = self.both(lambda j: j.claim_many(self.clock.now, lease, channel, limit))
            if not isinstance(records, str):
                for record in records:
                    self.tokens[record.id] = record.fencing_token

        @rule(data=st.data(), action=st.sampled_from(("ack_many", "fail_many")))
        def settle_many(self, data: st.DataObject, action: str) -> None:
            if not self.tokens:
                return
            ids = data.draw(st.lists(st.sampled_from(sorted(self.tokens)), unique=True, max_size=4))
            offsets = data.draw(st.lists(st.sampled_from((0, 0, -1)), min_size=len(ids), max_size=len(ids)))
            claims = [(i, max(self.tokens[i] + o, 1)) for i, o in zip(ids, offsets, strict=True)]
            now = self.clock.now
            if action == "ack_many":
                self.both(lambda j: j.ack_many(now, claims))
            else:
                self.both(lambda j: j.fail_many(now, [(i, token, "boom") for i, token in claims]))

        @rule(id_number=st.integers(0, 6))
        def replay(self, id_number: int) -> None:
            self.both(lambda j: j.replay(f"ev{id_number}"))

        @rule(ms=st.sampled_from((1, 60, 600)))
        def advance(self, ms: int) -> None:
            self.clock.advance(ms)

        @rule(ago=st.sampled_from((0, 100)))
        def prune(self, ago: int) -> None:
            self.both(lambda j: j.prune(self.clock.now - ago))

        @rule(
            tenant=st.sampled_from(TENANTS),
            state=st.sampled_from((None, "pending", "leased", "done", "dead")),
            channel=st.sampled_from((None, "", "inbound")),
            limit=st.sampled_from((1, 3, 200)),
        )
        def list_filtered(self, tenant: str, state: str | None, channel: str | None, limit: int) -> None:
            """Every filter of the journal page, followed page by page (issue 16, item 5)."""
            filters = {"tenant": tenant, "state": state, "channel": channel, "limit": limit}
            after = None
            while True:
                page = self.both(lambda j, after=after: j.list(**filters, after=after))
                if len(page) < limit:
                    break
                after = page[-1].id

        @invariant()
        def listings_agree(self) -> None:
            assert self.real.list(limit=200) == self.model.list(limit=200)
            for tenant in TENANTS:
                assert self.real.counts(tenant) == self.model.counts(tenant)

    run_state_machine_as_test(
        JournalMachine,
        settings=settings(
            max_examples=20 if backend in ("file", "sqlite") else 12,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
