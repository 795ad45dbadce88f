"""``./dev test --quick``: the fast inner loop (under a minute on two cores), not a replacement for ``./dev test``.

``pytest --quick`` does not collect the modules in ``SKIPPED_MODULES`` (real
processes, real servers — gunicorn, a live server —, SIGKILL/SIGTERM/SIGSTOP,
schemathesis, backups), starts no Redis Cluster, and deselects, reporting them as deselected:

- tests marked ``browser`` (Chromium), ``slow`` (long concurrency proofs) or ``services``;
- the tests in ``SKIPPED_TESTS``: single tests of 0.75 s or more on a quiet
  machine (real processes and leases, hypothesis machines, scale proofs, whole-API sweeps);
- a contract parametrized over backends, run on any but its in-memory reference
  (a parameter ``file``, ``sqlite``, ``postgresql``, ``redis``, ``redis-cluster``, ``kv-sqlite``, …):
  the durable backends run in the full suite, where every backend must pass the same contract.

Everything else runs. The full suite (``./dev test``) is unchanged.
"""

from __future__ import annotations

import re
from pathlib import Path

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

SKIPPED_TESTS = (  # single tests of 0.75 s or more on a quiet machine (CI's JUnit times), by node id prefix
    # real processes, real gunicorn, real-time leases and heartbeats
    "tests/coordination/test_scheduler.py::test_only_the_leading_beat_emits_and_a_follower_takes_over",
    "tests/events/test_worker.py::test_a_slow_live_handler_keeps_its_lease_by_heartbeat",
    "tests/inbox/test_demo.py::",
    "tests/inbox/test_webhooks_and_replies.py::test_a_provider_slower_than_the_lease_gets_one_request",
    "tests/inbox/test_webhooks_and_replies.py::test_a_status_before_the_send_answer_is_absorbed_into_the_reply",
    "tests/observability/test_cardinality.py::test_a_replica_that_stopped_pushing_leaves_metrics",
    "tests/observability/test_cardinality.py::test_uptime_is_the_same_whichever_gunicorn_worker_answers",
    "tests/observability/test_metrics.py::test_counters_are_summed_over_worker_processes",
    "tests/tenancy/test_erase.py::test_erase_killed_midway_finishes_when_run_again",
    "tests/crm/test_import_journal.py::test_an_import_whose_worker_is_killed_is_resumed_by_another_worker",
    "tests/kernel/test_atomicfile.py::test_a_writer_killed_mid_write_never_leaves_a_half_file",
    "tests/test_chunked_body.py::test_gunicorn_",
    "tests/test_json_errors.py::test_gunicorn_",
    "tests/test_json_errors.py::test_the_dev_server_answers_its_own_414_and_431_in_json_too",
    # hypothesis machines and property tests with many examples
    "tests/campaigns/test_indexed_reads.py::TestSlotIndexMachine",
    "tests/channels/test_parsers_robust.py::test_",
    "tests/crm/test_csv_roundtrip.py::test_exported_rows_parse_back_to_the_same_values",
    "tests/crm/test_indexed_reads.py::test_indexed_reads_equal_a_full_scan_after_random_histories",
    "tests/kv/test_conformance.py::test_backend_matches_the_memory_model",
    "tests/kv/test_indexes.py::TestIndexMachine",
    "tests/kv/test_indexes.py::test_encoding_preserves_tuple_order",
    # scale proofs (reads that do not grow with the data) and sweeps over every route
    "tests/campaigns/test_indexed_reads.py::test_planning_memory_does_not_grow_with_the_audience",
    "tests/inbox/test_indexed_reads.py::test_lists_counts_and_unread_totals_match_a_full_scan",
    "tests/inbox/test_indexed_reads.py::test_page_and_count_reads_do_not_grow_with_the_tenant",
    "tests/inbox/test_services.py::test_thread_view_reads_the_newest_messages_without_reading_a_long_conversation",
    "tests/events/test_retention.py::test_prune_works_through_more_records_than_one_batch",
    "tests/test_api_sweep.py::",
    "tests/test_json_errors.py::test_every_api_path_answers_a_method_it_lacks_with_json_405",
    "tests/test_json_errors.py::test_the_cursor_bound_fits_the_request_line_in_any_characters",
    "tests/test_timefmt.py::test_every_template_uses_the_one_time_filter",
    "tests/test_config_tuning.py::test_package_settings_from_the_environment_reach_the_packages",
    # the OpenAPI document built whole (the first build in a process costs about a second)
    "tests/inbox/test_api.py::test_openapi_documents_the_inbox_schemas",
    "tests/inbox/test_refused_input.py::test_openapi_",
    "tests/observability/test_api.py::test_push_endpoint_is_in_the_openapi_document",
    "tests/tenancy/test_api_auth.py::test_openapi_documents_the_routes",
    "tests/test_openapi.py::test_compare_and_set_operations_document_409_and_say_expected_version",
    "tests/test_openapi.py::test_schema_names_are_unique",
    # imports and uploads of whole files, demo loaders
    "tests/crm/test_api.py::test_import_upload_reports_rows_and_export_round_trips",
    "tests/inbox/test_api.py::test_ledger_push_journals_then_worker_projects",
    "tests/campaigns/test_pages.py::test_start_shows_progress_counts_and_the_deliveries_table",
    "tests/channels/test_providers.py::test_development_allows_a_loopback_fake_but_no_other_private_address",
    "tests/dashboard/test_bot_replicas.py::test_an_unreachable_coordinator_is_said_on_the_page_and_in_the_api",
)

# A backend parameter other than the in-memory reference (memory, kv-memory, memory-store, kv over MemoryKv).
DURABLE_PARAM = re.compile(r"(kv-)?(file|sqlite|postgresql|postgres|redis|redis-cluster)(-store)?")


def ignored(path: Path, config: pytest.Config) -> bool:
    """Return True if the quick profile does not even collect ``path`` (a module or folder of ``SKIPPED_MODULES``)."""
    if not config.getoption("quick"):
        return False
    relative = path.relative_to(config.rootpath).as_posix() if path.is_relative_to(config.rootpath) else ""
    return any(relative == m.rstrip("/") or relative.startswith(m) for m in SKIPPED_MODULES)


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
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        (dropped if skipped(item) else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
