"""Run the longest fault tests first, so ``pytest tests/faults -n 2`` ends with the short ones.

pytest-xdist hands tests to its workers in collection order; with a dozen
tests of 10–70 s each, a long one collected last runs alone at the end.
Longest first (the seconds below, measured on the shared 2-core machine)
keeps both workers busy to the end. Only the fault tests move, among the
places they already hold; every other test keeps its place.

(A test's own Celery producer app is made with ``set_as_current=False``: the
current app is the one a ``shared_task`` imported later binds to, and the
order of tests in a process is not fixed.)
"""

from __future__ import annotations

import pytest

# test name -> its usual run time (s); a test not listed counts as 10 s.
SECONDS = {
    "test_botmesh_run_restarts_a_killed_child_and_ctrl_c_still_stops_all": 70,
    "test_a_postgresql_outage_mid_ingest_answers_json_503_and_loses_nothing": 60,
    "test_sigterm_finishes_the_reply_in_flight_a_forced_exit_says_it_cut_one_off_and_a_restart_sends_the_rest": 55,
    "test_the_events_worker_sigkilled_twice_mid_ingest_stores_every_acknowledged_webhook_once": 50,
    "test_a_sender_frozen_past_its_lease_does_not_send_after_another_worker_took_over": 45,
    "test_redis_sigkilled_mid_campaign_sends_every_recipient_exactly_once": 45,
    "test_worker_holding_a_task_survives_redis_killed_and_restarted": 35,
    "test_corrupt_broker_messages_are_set_aside_and_a_real_worker_keeps_consuming": 30,
    "test_a_worker_forced_out_mid_campaign_exits_1_and_logs_the_sends_it_cut_off": 23,
    "test_a_forced_exit_that_cuts_the_record_in_hand_off_exits_1_and_says_so": 21,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    slots = [i for i, item in enumerate(items) if item.nodeid.startswith("tests/faults/")]
    ordered = sorted(
        (items[i] for i in slots), key=lambda item: -SECONDS.get(getattr(item, "originalname", item.name), 10)
    )
    for slot, item in zip(slots, ordered, strict=True):
        items[slot] = item
