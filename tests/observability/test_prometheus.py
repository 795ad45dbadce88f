"""Text format 0.0.4: checked with prometheus_client's parser and with promtool."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from botmesh_admin.observability.prometheus import to_prometheus, to_prometheus_many

from .test_domain import BOTMESH_JSON

FAMILIES = [
    "uptime_seconds",
    "conversations_active",
    "conversations_started_total",
    "conversations_ended_total",
    "conversation_duration_avg_seconds",
    "flow_started_total",
    "flow_ended_total",
    "flow_duration_avg_seconds",
    "messages_in_total",
    "messages_out_total",
    "inbound_dropped_total",
    "presence_skipped_total",
    "triggers_total",
    "errors_total",
]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def promtool_check(text: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("BOTMESH_REQUIRE_SERVICES") == "1":
            pytest.fail("promtool is required (BOTMESH_REQUIRE_SERVICES=1)")
        pytest.skip("promtool not installed")
    result = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=30)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    assert result.stdout.decode().strip() == "" and result.stderr.decode().strip() == ""


def test_every_family_has_one_help_and_one_type_line_and_the_text_ends_with_newline() -> None:
    text = to_prometheus(BOTMESH_JSON)
    assert text.endswith("\n")
    for name in FAMILIES:
        assert text.count(f"# HELP botmesh_{name} ") == 1
        assert text.count(f"# TYPE botmesh_{name} ") == 1


def test_values_read_back_with_the_prometheus_parser() -> None:
    got = samples(to_prometheus(BOTMESH_JSON))
    assert got[("botmesh_uptime_seconds", ())] == 273600.0
    assert got[("botmesh_conversations_ended_total", (("outcome", "timed_out"),))] == 1
    assert got[("botmesh_conversations_ended_total", (("outcome", "error"),))] == 1
    assert got[("botmesh_conversation_duration_avg_seconds", ())] == 5.4005
    assert got[("botmesh_flow_ended_total", (("flow", "checkout"), ("outcome", "completed")))] == 3
    assert got[("botmesh_flow_duration_avg_seconds", (("flow", "checkout"),))] == 1.2
    assert got[("botmesh_messages_out_total", (("result", "failed"),))] == 2
    assert got[("botmesh_messages_out_total", (("result", "sent"),))] == 100
    assert got[("botmesh_inbound_dropped_total", (("reason", "handoff"),))] == 4
    assert got[("botmesh_presence_skipped_total", (("kind", "mark_read"),))] == 2
    assert got[("botmesh_triggers_total", ())] == 5


def test_output_passes_promtool() -> None:
    promtool_check(to_prometheus(BOTMESH_JSON, labels={"tenant": "tienda", "bot": "tienda-bot"}))


def test_label_values_are_escaped() -> None:
    nasty = 'a\\b"c\nd'
    text = to_prometheus(BOTMESH_JSON, labels={"replica": nasty})
    assert 'replica="a\\\\b\\"c\\nd"' in text
    got = samples(text)
    assert got[("botmesh_triggers_total", (("replica", nasty),))] == 5
    promtool_check(text)


def test_flow_names_are_label_values_and_escaped() -> None:
    text = to_prometheus({"flows": {'say "hi" \\ now': {"started": 1}}})
    assert samples(text)[("botmesh_flow_started_total", (("flow", 'say "hi" \\ now'),))] == 1


def test_families_stay_contiguous_across_series_sets() -> None:
    text = to_prometheus_many(
        [
            (BOTMESH_JSON, None),
            (BOTMESH_JSON, {"tenant": "a", "bot": "b", "replica": "r1"}),
            (BOTMESH_JSON, {"tenant": "a", "bot": "b", "replica": "r2"}),
        ]
    )
    seen: list[str] = []
    for line in text.splitlines():
        if line.startswith("# TYPE"):
            seen.append(line.split()[2])
    assert seen == [f"botmesh_{n}" for n in FAMILIES]
    current = None
    for line in text.splitlines():
        if line.startswith("# TYPE"):
            current = line.split()[2]
        elif not line.startswith("#"):
            assert line.startswith(current), f"{line!r} outside its family {current}"
    families = list(text_string_to_metric_families(text))
    assert len(families) == len(FAMILIES)
    promtool_check(text)


def test_custom_prefix() -> None:
    text = to_prometheus(BOTMESH_JSON, prefix="shop_")
    assert "# TYPE shop_errors_total counter" in text and "botmesh_" not in text


@pytest.mark.parametrize("prefix", ["1abc_", "bot-mesh_", "bot:mesh_", "__botmesh_", "bot mesh", 7])
def test_an_invalid_prefix_raises_type_error(prefix: object) -> None:
    with pytest.raises(TypeError):
        to_prometheus(BOTMESH_JSON, prefix=prefix)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["__tenant", "ten:ant", "9lives", "ten-ant", "", "outcome", "flow"])
def test_an_invalid_label_name_raises_type_error(name: str) -> None:
    with pytest.raises(TypeError):
        to_prometheus(BOTMESH_JSON, labels={name: "x"})
