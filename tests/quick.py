"""``./dev test --quick``: the fast inner loop (under a minute on two cores), not a replacement for ``./dev test``.

``pytest --quick`` deselects, and reports as deselected:

- tests marked ``browser`` (Chromium), ``slow`` (long concurrency proofs) or ``services``;
- the modules in ``SKIPPED_MODULES``: real processes, real servers (gunicorn, a
  live server), SIGKILL/SIGTERM/SIGSTOP, schemathesis, backups;
- the tests in ``SKIPPED_TESTS``: single tests that start processes or wait out
  real leases and heartbeats (each ≥ 1 s on a quiet machine);
- a contract parametrized over backends, run on any but its in-memory reference
  (a parameter ``file``, ``sqlite``, ``postgresql``, ``redis``, ``redis-cluster``, ``kv-sqlite``, …):
  the durable backends run in the full suite, where every backend must pass the same contract.

Everything else runs. The full suite (``./dev test``) is unchanged.
"""

from __future__ import annotations

import re

import pytest

SKIPPED_MARKERS = ("browser", "slow", "services")

SKIPPED_MODULES = (
    "tests/faults/",  # kills, outages, full disks: real processes
    "tests/backup/",
    "tests/browser/",
    "tests/test_schemathesis.py",
    "tests/botclient/test_replica_live.py",
    "tests/campaigns/test_processes.py",
    "tests/campaigns/test_sigterm_drain.py",
    "tests/channels/test_webhooks_live.py",
    "tests/coordination/test_frozen_job_holder.py",
    "tests/coordination/test_kv_processes.py",
    "tests/coordination/test_processes.py",
    "tests/crm/test_concurrency.py",
    "tests/dashboard/test_failover.py",
    "tests/dashboard/test_run_command.py",
    "tests/deploy/test_secrets.py",
    "tests/deploy/test_smoke_port.py",
    "tests/events/test_command.py",
    "tests/events/test_processes.py",
    "tests/inbox/test_edits_live.py",
    "tests/inbox/test_reply_crash.py",
    "tests/observability/test_shutdown.py",
)

SKIPPED_TESTS = (
    "tests/channels/test_parsers_robust.py::test_",  # hypothesis, 150 examples per parser
    "tests/coordination/test_scheduler.py::test_two_racing_leaders_record_each_occurrence_once",
    "tests/dashboard/test_bot_replicas.py::test_a_silent_replica_is_not_responding_then_leaves_after_three_leases",
    "tests/dashboard/test_bot_replicas.py::test_a_killed_leader_is_not_responding_and_the_handover_says",
    "tests/inbox/test_demo.py::",
    "tests/inbox/test_indexed_reads.py::test_lists_counts_and_unread_totals_match_a_full_scan",
    "tests/inbox/test_indexed_reads.py::test_page_and_count_reads_do_not_grow_with_the_tenant",
    "tests/observability/test_cardinality.py::test_uptime_is_the_same_whichever_gunicorn_worker_answers",
    "tests/observability/test_metrics.py::test_counters_are_summed_over_worker_processes",
    "tests/tenancy/test_erase.py::test_erase_killed_midway_finishes_when_run_again",
    "tests/test_chunked_body.py::test_gunicorn_",
    "tests/test_json_errors.py::test_gunicorn_",
    "tests/test_json_errors.py::test_the_dev_server_answers_its_own_414_and_431_in_json_too",
)

# A backend parameter other than the in-memory reference (memory, kv-memory, memory-store, kv over MemoryKv).
DURABLE_PARAM = re.compile(r"(kv-)?(file|sqlite|postgresql|postgres|redis|redis-cluster)(-store)?")


def skipped(item: pytest.Item) -> bool:
    """Return True if the quick profile leaves ``item`` out."""
    if any(item.get_closest_marker(name) for name in SKIPPED_MARKERS):
        return True
    nodeid = item.nodeid
    if nodeid.startswith(SKIPPED_MODULES) or nodeid.startswith(SKIPPED_TESTS):
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and any(DURABLE_PARAM.fullmatch(str(p)) for p in callspec.params.values())


def deselect(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop the items the quick profile leaves out (``pytest --quick``), reporting them as deselected."""
    if not config.getoption("quick"):
        return
    kept, dropped = [], []
    for item in items:
        (dropped if skipped(item) else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
