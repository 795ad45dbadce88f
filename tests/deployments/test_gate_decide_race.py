"""A gate is decided once: a second decision that passed the first check is refused in the reservation (review fix).

``gate_decide`` checked ``awaits_decision`` before reserving the gate and not again, so a
decision landing between the two (another admin, a double submit) was silently overridden.
Here the other admin's decision lands exactly there: in the first call of ``gate_run_start``.
"""

from __future__ import annotations

import pytest
from django.test import Client

from deployments import services
from deployments.services import gates

from .conftest import World
from .test_api import BOT, _bot, _post


def test_a_decision_that_lands_after_the_check_makes_the_second_409_not_an_override(
    client: Client, world: World, versions, monkeypatch: pytest.MonkeyPatch
) -> None:
    rc = versions[-1]
    assert _post(client, _bot(world, "/versions"), rc, world.admin).status_code == 201
    original = gates.gate_run_start
    landed: list[str] = []

    def other_admin_first(*args, **kwargs):  # type: ignore[no-untyped-def]
        if not landed:  # between this request's check and its reservation, the other admin approves
            landed.append("approve")
            services.gate_decide(
                world.a, BOT, rc["version"], "manual-approval", decision="approve", reason="QA ok", actor="bo"
            )
        return original(*args, **kwargs)

    monkeypatch.setattr(gates, "gate_run_start", other_admin_first)
    url = _bot(world, f"/versions/{rc['version']}/gates/manual-approval/decision")
    second = _post(client, url, {"decision": "reject", "reason": "double submit"}, world.admin)
    assert landed == ["approve"]
    assert second.status_code == 409, second.content
    assert second.json()["error"] == "gate_not_decidable"
    monkeypatch.undo()
    version = client.get(_bot(world, f"/versions/{rc['version']}"), **world.agent).json()
    gate = next(g for g in version["gates"] if g["name"] == "manual-approval")
    assert gate["status"] == "succeeded" and gate["details"] == "approved by bo: QA ok"  # the first decision stands
