"""Deployments services and selectors over every store: immutability, gates, one active version, rollback, pruning."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from botmesh_admin.clock import FakeClock
from botmesh_admin.errors import Conflict, NotFound, ValidationError
from deployments import selectors, services
from deployments.domain import GateBusy, GatesNotPassed, StaleGateRun, VersionExists
from deployments.stores.base import DeploymentStore

from .conftest import GATES, pass_gates

BOT = "tienda-bot"


def _publish_all(tenant: str, versions) -> None:
    for v in versions:
        services.version_publish(tenant, spec=v, actor="token:ci")


def test_publish_is_immutable_and_sequenced(registry: DeploymentStore, tenant_id: str, versions) -> None:
    published = [services.version_publish(tenant_id, spec=v, actor="token:ci") for v in versions]
    assert [(v.version, v.seq, created) for v, created in published] == [
        ("1.0.0", 1, True),
        ("1.1.0", 2, True),
        ("1.1.1", 3, True),
        ("1.2.0", 4, True),
        ("2.0.0-rc.1", 5, True),
    ]
    again, created = services.version_publish(tenant_id, spec=dict(versions[1]), actor="token:ci")
    assert not created and again == published[1][0], "same version, same content: a no-op"
    with pytest.raises(VersionExists) as info:
        services.version_publish(tenant_id, spec={**versions[1], "notes": "rewritten history"}, actor="token:ci")
    assert info.value.status == 409
    assert selectors.version_get(tenant_id, BOT, "1.1.0").spec.notes == "menu de pedidos"
    assert [e.action for e in selectors.deployment_audit_list(tenant_id, BOT)] == ["published"] * 5


def test_publish_with_a_bot_other_than_the_urls_is_refused(registry: DeploymentStore, tenant_id: str, versions) -> None:
    with pytest.raises(ValidationError) as info:
        services.version_publish(tenant_id, spec=versions[0], actor="token:ci", bot="soporte-bot")
    assert info.value.field == "version.bot"


def test_activation_requires_every_gate_succeeded(registry: DeploymentStore, tenant_id: str, versions) -> None:
    _publish_all(tenant_id, versions[:2])
    with pytest.raises(GatesNotPassed):
        services.deployment_activate(tenant_id, BOT, "1.0.0", actor="user:ana")
    for gate, result in zip(GATES, ("succeeded", "succeeded", "inconclusive"), strict=True):
        run = services.gate_run_start(tenant_id, BOT, "1.0.0", gate, actor="ci")
        services.gate_run_finish(
            tenant_id,
            BOT,
            "1.0.0",
            gate,
            run_id=run.run_id,
            result=result,
            details=f"{gate} done",
            actor="ci",
        )
    with pytest.raises(GatesNotPassed) as info:
        services.deployment_activate(tenant_id, BOT, "1.0.0", actor="user:ana")
    assert "manual-approval=inconclusive" in info.value.message, "inconclusive never promotes"
    run = services.gate_run_start(tenant_id, BOT, "1.0.0", "manual-approval", actor="user:ana")
    v = services.gate_run_finish(
        tenant_id,
        BOT,
        "1.0.0",
        "manual-approval",
        run_id=run.run_id,
        result="succeeded",
        actor="user:ana",
    )
    assert v.gates_passed and v.gate("manual-approval").runs == 2
    pointer = services.deployment_activate(tenant_id, BOT, "1.0.0", actor="user:ana")
    assert (pointer.version, pointer.kind, pointer.previous_version, pointer.revision) == (
        "1.0.0",
        "activate",
        None,
        1,
    )
    assert services.deployment_activate(tenant_id, BOT, "1.0.0", actor="user:ana") == pointer, (
        "activating again is a no-op"
    )


def test_one_gate_run_at_a_time_and_expired_reservations_are_taken_over(
    registry: DeploymentStore, clock: FakeClock, tenant_id: str, versions
) -> None:
    _publish_all(tenant_id, versions[:1])
    first = services.gate_run_start(tenant_id, BOT, "1.0.0", "unit-tests", actor="runner-1", lease_ms=60_000)
    assert first.expires_at == clock() + 60_000
    with pytest.raises(GateBusy) as info:
        services.gate_run_start(tenant_id, BOT, "1.0.0", "unit-tests", actor="runner-2")
    assert info.value.details["run_id"] == first.run_id
    other_gate = services.gate_run_start(tenant_id, BOT, "1.0.0", "conversation-replay", actor="runner-2")
    assert other_gate.run_id != first.run_id, "another gate of the same version may run"
    clock.advance(60_001)
    second = services.gate_run_start(tenant_id, BOT, "1.0.0", "unit-tests", actor="runner-2")
    assert second.took_over == first.run_id
    with pytest.raises(StaleGateRun):
        services.gate_run_finish(
            tenant_id,
            BOT,
            "1.0.0",
            "unit-tests",
            run_id=first.run_id,
            result="succeeded",
            actor="runner-1",
        )
    services.gate_run_finish(
        tenant_id,
        BOT,
        "1.0.0",
        "unit-tests",
        run_id=second.run_id,
        result="failed",
        details="3 tests failed",
        actor="runner-2",
    )
    with pytest.raises(StaleGateRun):
        services.gate_run_finish(
            tenant_id,
            BOT,
            "1.0.0",
            "unit-tests",
            run_id=second.run_id,
            result="succeeded",
            actor="runner-2",
        )
    gate = selectors.version_get(tenant_id, BOT, "1.0.0").gate("unit-tests")
    assert (gate.status, gate.details) == ("failed", "3 tests failed")
    actions = [e.action for e in selectors.deployment_audit_list(tenant_id, BOT)]
    assert actions[:3] == ["gate_run_finished", "gate_run_started", "gate_run_taken_over"]
    taken = next(e for e in selectors.deployment_audit_list(tenant_id, BOT) if e.action == "gate_run_taken_over")
    assert taken.detail["expired_run_id"] == first.run_id and taken.detail["expired_runner"] == "runner-1"


def test_gate_inputs_are_validated(registry: DeploymentStore, tenant_id: str, versions) -> None:
    _publish_all(tenant_id, versions[:1])
    with pytest.raises(NotFound):
        services.gate_run_start(tenant_id, BOT, "1.0.0", "no-such-gate", actor="ci")
    with pytest.raises(NotFound):
        services.gate_run_start(tenant_id, BOT, "9.9.9", "unit-tests", actor="ci")
    run = services.gate_run_start(tenant_id, BOT, "1.0.0", "unit-tests", actor="ci")
    with pytest.raises(ValidationError) as info:
        services.gate_run_finish(tenant_id, BOT, "1.0.0", "unit-tests", run_id=run.run_id, result="passed", actor="ci")
    assert info.value.field == "result"
    with pytest.raises(ValidationError) as info:
        services.gate_run_start(tenant_id, BOT, "1.0.0", "manual-approval", actor="ci", lease_ms=10)
    assert info.value.field == "lease_ms"


def test_rollback_targets_retained_versions_and_records_the_origin(
    registry: DeploymentStore, tenant_id: str, versions
) -> None:
    _publish_all(tenant_id, versions)
    for v in ("1.0.0", "1.1.0", "1.2.0"):
        pass_gates(tenant_id, v)
    with pytest.raises(ValidationError):
        services.deployment_rollback(tenant_id, BOT, to="1.0.0", actor="user:ana")
    services.deployment_activate(tenant_id, BOT, "1.1.0", actor="user:ana")
    services.deployment_activate(tenant_id, BOT, "1.2.0", actor="user:ana")
    back = services.deployment_rollback(tenant_id, BOT, to="1.1.0", actor="user:ana")
    assert (back.version, back.kind, back.previous_version) == ("1.1.0", "rollback", "1.2.0")
    rolled = next(e for e in selectors.deployment_audit_list(tenant_id, BOT) if e.action == "rolled_back")
    assert rolled.detail["previous_version"] == "1.2.0" and rolled.actor == "user:ana"
    with pytest.raises(GatesNotPassed):
        services.deployment_rollback(tenant_id, BOT, to="1.1.1", actor="user:ana")
    assert services.version_prune(tenant_id, BOT, keep=2, actor="user:ana") == ["1.1.1", "1.0.0"]
    with pytest.raises(NotFound):
        services.deployment_rollback(tenant_id, BOT, to="1.0.0", actor="user:ana")


def test_prune_never_deletes_the_active_version_or_a_running_gate(
    registry: DeploymentStore, tenant_id: str, versions
) -> None:
    _publish_all(tenant_id, versions)
    pass_gates(tenant_id, "1.0.0")
    services.deployment_activate(tenant_id, BOT, "1.0.0", actor="user:ana")
    services.gate_run_start(tenant_id, BOT, "1.1.0", "unit-tests", actor="ci")
    pruned = services.version_prune(tenant_id, BOT, keep=1, actor="user:ana")
    assert pruned == ["1.2.0", "1.1.1"]
    assert [v.version for v in selectors.version_list(tenant_id, BOT)] == ["2.0.0-rc.1", "1.1.0", "1.0.0"]
    event = selectors.deployment_audit_list(tenant_id, BOT)[0]
    assert (event.action, event.detail["versions"], event.detail["keep"]) == (
        "pruned",
        ["1.2.0", "1.1.1"],
        1,
    )
    with pytest.raises(VersionExists):
        services.version_publish(tenant_id, spec=versions[3], actor="token:ci")
    with pytest.raises(ValidationError):
        services.version_prune(tenant_id, BOT, keep=0, actor="user:ana")


def test_retain_versions_prunes_after_each_publish(
    registry: DeploymentStore, settings, tenant_id: str, versions
) -> None:
    settings.BOTMESH_RETAIN_VERSIONS = 2
    services.version_publish(tenant_id, spec=versions[0], actor="token:ci")
    pass_gates(tenant_id, "1.0.0")
    services.deployment_activate(tenant_id, BOT, "1.0.0", actor="user:ana")
    _publish_all(tenant_id, versions[1:])
    assert [v.version for v in selectors.version_list(tenant_id, BOT)] == ["2.0.0-rc.1", "1.2.0", "1.0.0"]
    pruners = {e.actor for e in selectors.deployment_audit_list(tenant_id, BOT) if e.action == "pruned"}
    assert pruners == {"system:retention"}


def test_list_paginates_newest_first(registry: DeploymentStore, tenant_id: str, versions) -> None:
    _publish_all(tenant_id, versions)
    page1 = selectors.version_list(tenant_id, BOT, limit=2)
    page2 = selectors.version_list(tenant_id, BOT, limit=2, after=str(page1[-1].seq))
    page3 = selectors.version_list(tenant_id, BOT, limit=2, after=str(page2[-1].seq))
    assert [v.version for v in page1 + page2 + page3] == [
        "2.0.0-rc.1",
        "1.2.0",
        "1.1.1",
        "1.1.0",
        "1.0.0",
    ]
    with pytest.raises(ValidationError):
        selectors.version_list(tenant_id, BOT, limit=2, after="garbage")
    with pytest.raises(ValidationError):
        selectors.version_list(tenant_id, BOT, limit=201)


def test_another_tenant_sees_nothing(registry: DeploymentStore, tenant_id: str, versions) -> None:
    _publish_all(tenant_id, versions[:1])
    other = tenant_id + "-b"
    with pytest.raises(NotFound):
        selectors.version_get(other, BOT, "1.0.0")
    with pytest.raises(NotFound):
        services.deployment_activate(other, BOT, "1.0.0", actor="user:ana")
    assert selectors.version_list(other, BOT) == [] and selectors.bot_list(other) == []


# ------------------------------------------------------------------ races (real threads)

ROUNDS = 10


def _together(*calls: Callable[[], object]) -> list[object]:
    """Run ``calls`` in threads released by one barrier; return each result or raised exception."""
    barrier = threading.Barrier(len(calls))
    results: list[object] = [None] * len(calls)

    def run(i: int, call: Callable[[], object]) -> None:
        barrier.wait(timeout=10)
        try:
            results[i] = call()
        except Exception as exc:  # the outcome under test
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive(), "a racer hung"
    return results


def test_two_concurrent_activations_leave_one_winner_and_one_conflict(
    registry: DeploymentStore, tenant_id: str, versions
) -> None:
    _publish_all(tenant_id, versions[:4])
    for v in ("1.0.0", "1.1.0", "1.1.1", "1.2.0"):
        pass_gates(tenant_id, v)
    pairs = [("1.1.0", "1.1.1"), ("1.2.0", "1.0.0")]
    for round_ in range(ROUNDS):
        a, b = pairs[round_ % 2]
        current = selectors.deployment_active(tenant_id, BOT)
        seen = current.revision if current else 0
        results = _together(
            lambda a=a, seen=seen: services.deployment_activate(
                tenant_id, BOT, a, actor="user:ana", expected_revision=seen
            ),
            lambda b=b, seen=seen: services.deployment_activate(
                tenant_id, BOT, b, actor="user:bo", expected_revision=seen
            ),
        )
        winners = [r for r in results if not isinstance(r, Exception)]
        losers = [r for r in results if isinstance(r, Exception)]
        assert len(winners) == 1 and len(losers) == 1, results
        assert isinstance(losers[0], Conflict) and losers[0].status == 409
        final = selectors.deployment_active(tenant_id, BOT)
        assert final == winners[0] and final.revision == seen + 1


def test_concurrent_gate_starts_reserve_once(registry: DeploymentStore, tenant_id: str, versions) -> None:
    _publish_all(tenant_id, versions[:1])
    for _ in range(ROUNDS):
        results = _together(
            *[
                (lambda i=i: services.gate_run_start(tenant_id, BOT, "1.0.0", "unit-tests", actor=f"runner-{i}"))
                for i in range(3)
            ]
        )
        runs = [r for r in results if not isinstance(r, Exception)]
        assert len(runs) == 1, results
        assert all(isinstance(r, GateBusy) for r in results if isinstance(r, Exception))
        services.gate_run_finish(
            tenant_id, BOT, "1.0.0", "unit-tests", run_id=runs[0].run_id, result="error", actor="ci"
        )
    assert selectors.version_get(tenant_id, BOT, "1.0.0").gate("unit-tests").runs == ROUNDS


def test_concurrent_publishes_get_distinct_sequence_numbers(
    registry: DeploymentStore, tenant_id: str, versions
) -> None:
    specs = [{**versions[0], "version": f"3.0.{i}"} for i in range(6)]
    results = _together(*[(lambda s=s: services.version_publish(tenant_id, spec=s, actor="token:ci")) for s in specs])
    assert not [r for r in results if isinstance(r, Exception)], results
    assert sorted(v.seq for v, _ in results) == list(range(1, 7))
    same = _together(
        *[(lambda: services.version_publish(tenant_id, spec={**versions[0], "version": "4.0.0"}, actor="ci"))] * 3
    )
    assert sum(1 for _, created in same if created) == 1, "one publish creates, the others are no-ops"


def test_prune_racing_activation_never_deletes_the_active_version(
    registry: DeploymentStore, tenant_id: str, versions
) -> None:
    _publish_all(tenant_id, versions)
    for v in ("1.0.0", "1.1.0"):
        pass_gates(tenant_id, v)
    for round_ in range(ROUNDS):
        target = ("1.0.0", "1.1.0")[round_ % 2]
        results = _together(
            lambda target=target: services.deployment_activate(tenant_id, BOT, target, actor="user:ana"),
            lambda: services.version_prune(tenant_id, BOT, keep=3, actor="user:bo"),
        )
        active = selectors.deployment_active(tenant_id, BOT)
        if active is not None:
            assert selectors.version_get(tenant_id, BOT, active.version).version == active.version, results
        if isinstance(results[0], NotFound):
            break  # prune won and removed the target first: it is gone, not active


def test_32_concurrent_publishes_of_distinct_versions_all_succeed(
    registry: DeploymentStore, tenant_id: str, versions
) -> None:
    # 32 writers race for the bot's one seq counter: each attempt has one winner, so a publish may lose
    # many rounds in a row — more than the default CAS_ATTEMPTS (8) — and must still not answer 409.
    specs = [{**versions[0], "version": f"5.0.{i}"} for i in range(32)]
    results = _together(*[(lambda s=s: services.version_publish(tenant_id, spec=s, actor="token:ci")) for s in specs])
    assert not [r for r in results if isinstance(r, Exception)], results
    assert sorted(v.seq for v, _ in results) == list(range(1, 33))
