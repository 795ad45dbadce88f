"""A frozen job holder's effects happen once (issue 17, item 2), with real Celery worker processes.

What failed: a worker SIGSTOPped past the job lease and resumed ran the same
occurrence to its end after another worker had re-run it; only its ack was
refused, and the jobs page showed ``done, attempts 2`` with no sign of it.

Here two ``celery worker -P solo`` processes run on the embedded default of
the test's own (SQLite Kv and journal, filesystem broker: no server to share).
The occurrence's task (``jobtasks.fenced_effect``) starts, waits for the
test's go, then commits its effect fenced by the occurrence. The test freezes
the worker that started it (SIGSTOP) before that commit; past the 2 s lease the
other worker takes the occurrence over and completes it (the effect applied
once); then the first one resumes (SIGCONT) and reaches its commit: refused,
the effect still applied once, the run recorded as superseded in the run log
and shown on the jobs page. Every process is stopped by ``Processes``, also on
failure (and a frozen one is resumed first).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from django.contrib.auth import get_user_model
from django.test import Client
from kombu import Connection

from botmesh_admin.coordination import services
from botmesh_admin.coordination.memory import MemoryCoordinationHub, MemoryCoordinator
from botmesh_admin.coordination.occurrences import superseded_get_many
from botmesh_admin.coordination.registry import register_job, unregister_job
from botmesh_admin.coordination.stores.kv import KvJobStore
from botmesh_admin.events import connect_journal, use_journal
from botmesh_admin.kv import Put, connect
from botmesh_admin.kv.runtime import use_kv
from tests.faults.servers import Processes, fault_report, project_env, python
from tests.polling import wait_until

from .jobtasks import EFFECT_TABLE, fenced_job

pytestmark = [pytest.mark.slow, pytest.mark.django_db]

LEASE_S = 2
FILESYSTEM_TRANSPORT = "botmesh_admin.filesystem_broker:Transport"


def broker_options(broker: Path) -> dict[str, object]:
    """The transport options ``settings.py`` gives the filesystem broker in ``broker``."""
    return {
        "data_folder_in": str(broker / "queue"), "data_folder_out": str(broker / "queue"),
        "processed_folder": str(broker / "processed"), "control_folder": str(broker / "control"),
        "corrupt_folder": str(broker / "corrupt"), "store_processed": False,
    }  # fmt: skip


class Broker:
    """Sends ``jobs.run`` through the workers' filesystem broker, as beat does."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.app = Celery("fenced-producer", set_as_current=False)
        self.sent = 0
        self._at = 0.0
        for name in ("queue", "processed"):
            (folder / name).mkdir(parents=True, exist_ok=True)

    def send(self, task: str, kwargs: dict[str, Any], options: dict[str, Any] | None = None) -> None:
        with Connection("filesystem://", transport=FILESYSTEM_TRANSPORT,
                        transport_options=broker_options(self.folder)) as conn:  # fmt: skip
            self.app.send_task(task, kwargs=kwargs, connection=conn, retry=False)
        self.sent += 1
        self._at = time.monotonic()

    def nudge(self, channel: str) -> None:
        """Send ``jobs.run`` again when none is queued (beat's safety net does this every 5 s)."""
        queued = [p for p in (self.folder / "queue").iterdir() if p.name.endswith(".msg")]
        if not queued and time.monotonic() - self._at > 0.5:
            self.send(services.RUN_TASK, {"channel": channel})


def starts(kv: Any) -> dict[int, dict[str, Any]]:
    """The runs of the task that started: fencing token → ``{"pid", "attempt", "worker"}``."""
    return {int(e.key.split("/")[1]): e.value for e in kv.scan(EFFECT_TABLE, prefix="start/", limit=100)}


def keys(kv: Any, prefix: str) -> dict[int, Any]:
    return {int(e.key.split("/")[1]): e.value for e in kv.scan(EFFECT_TABLE, prefix=prefix, limit=100)}


def test_a_frozen_holder_resumed_after_a_takeover_has_its_effect_refused_and_shown_superseded(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    kv_url, journal_url = f"sqlite:///{data}/kv.sqlite3", f"sqlite:///{data}/journal.sqlite3"
    env = {**project_env(tmp_path), "CELERY_BROKER_URL": "filesystem://", "BOTMESH_KV_URL": kv_url,
           "BOTMESH_JOURNAL_URL": journal_url}  # fmt: skip
    spec = fenced_job(LEASE_S)
    channel = services.jobs_channel(spec)
    kv, journal = connect(kv_url), connect_journal(journal_url)
    broker = Broker(data / "broker")
    frozen: int | None = None
    began = time.monotonic()
    with Processes(tmp_path) as procs:
        names: dict[int, str] = {}
        for n in (1, 2):
            names[procs.start(f"worker-{n}", [
                python(), "-m", "celery", "-A", "tests.coordination.fenced_app", "worker", "-P", "solo",
                "-l", "INFO", "-n", f"fenced-{n}@%h", "--without-mingle", "--without-gossip", "--without-heartbeat",
            ], env).pid] = f"worker-{n}"  # fmt: skip
        try:
            wait_until(lambda: all("ready." in procs.log(f"worker-{n}") for n in (1, 2)), "both workers", 40)
            ready_s = time.monotonic() - began
            emitted_at = time.monotonic()

            # The scheduler leader records the occurrence in the ledger and tells the workers.
            leader = MemoryCoordinator(MemoryCoordinationHub(), "proof-beat", lease_ms=5000, role="beat")
            lease = leader.try_lead("scheduler")
            assert lease is not None
            at = services.now_ms() // 60_000 * 60_000
            services.scheduler_tick(specs=[spec], lease=lease, send=broker.send, at_ms=at,
                                    store=KvJobStore(kv), journal=journal)  # fmt: skip
            leader.close()
            occurrence = f"{spec.id}@{at}"

            # 1. A worker starts the run: freeze it before its fenced commit.
            wait_until(lambda: bool(starts(kv)), "a worker to start the occurrence", 20)
            ((first, run_1),) = starts(kv).items()
            os.kill(run_1["pid"], signal.SIGSTOP)
            frozen = run_1["pid"]
            frozen_at = time.monotonic()

            # 2. Past its lease the other worker takes the occurrence over and completes it.
            def completed_by_another() -> bool:
                for token in starts(kv):
                    if token != first and kv.get(EFFECT_TABLE, f"go/{token}") is None:
                        kv.commit(EFFECT_TABLE, [Put(f"go/{token}", True)])
                record = next(r for r in journal.list(tenant="system") if r.idempotency_key == occurrence)
                if record.state == "done":
                    return True
                broker.nudge(channel)
                return False

            wait_until(completed_by_another, "another worker to take the occurrence over and complete it", 30)
            takeover_s = time.monotonic() - frozen_at
            assert keys(kv, "by/").keys() != {first} and len(keys(kv, "by/")) == 1

            # 3. The frozen worker resumes and reaches its fenced commit.
            kv.commit(EFFECT_TABLE, [Put(f"go/{first}", True)])
            os.kill(frozen, signal.SIGCONT)
            frozen = None
            wait_until(lambda: first in keys(kv, "refused/"), "the resumed run's fenced commit to be refused", 20)
            wait_until(lambda: "handler failed after its lease was lost" in procs.log(names[run_1["pid"]]),
                       "the resumed run to end", 20)  # fmt: skip
            scenario_s = time.monotonic() - emitted_at
        except BaseException:
            for n in (1, 2):
                print(f"--- worker-{n}\n{procs.log(f'worker-{n}')[-4000:]}")
            raise
        finally:
            if frozen is not None:
                os.kill(frozen, signal.SIGCONT)  # so that it can stop gracefully
            for pid in names:  # both at once; Processes then waits for each (and SIGKILLs a straggler)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGTERM)

    applied = kv.get(EFFECT_TABLE, "applied")
    (record,) = [r for r in journal.list(tenant="system") if r.idempotency_key == occurrence]
    by, refused = keys(kv, "by/"), keys(kv, "refused/")
    runs = starts(kv)
    (superseded,) = superseded_get_many(kv, [occurrence])[occurrence]
    effects = applied.value if applied else 0
    fault_report(f"FAULT frozen-job-holder: lease {LEASE_S} s, workers ready in {ready_s:.1f} s, takeover "
                 f"{takeover_s:.1f} s after SIGSTOP, runs started {len(runs)}, effects applied {effects}, "
                 f"duplicates {max(effects - 1, 0)}, lost {int(effects == 0)}, fenced commits refused "
                 f"{len(refused)}, superseded recorded 1, ledger {record.state} attempts {record.attempts}; "
                 f"scenario {scenario_s:.1f} s, {time.monotonic() - began:.1f} s with start and stop")  # fmt: skip

    assert applied is not None and applied.value == 1, "the effect was applied once"
    assert set(by) == {record.fencing_token} and first not in by
    assert refused == {first: {"pid": run_1["pid"], "by_token": record.fencing_token}}
    assert record.state == "done" and record.attempts == len(runs) >= 2
    assert superseded.worker == run_1["worker"] and superseded.worker.endswith(f"-{run_1['pid']}")
    assert (superseded.fencing_token, superseded.attempt) == (first, 1)
    assert superseded.by_token == record.fencing_token

    # The jobs page shows the superseded run beside "done, 2 attempts".
    from botmesh_admin.tenancy import services as tenancy

    get_user_model().objects.create_user("sre", password="sre-password-1")
    tenancy.tenant_create("frozen", name="Frozen")
    tenancy.membership_set("frozen", username="sre", role="admin")
    client = Client()
    assert client.login(username="sre", password="sre-password-1")
    register_job(spec)
    try:
        with use_kv(kv), use_journal(journal):
            html = client.get("/t/frozen/jobs/").content.decode()
    finally:
        unregister_job(spec.id)
    row = html.split(f'data-job="{spec.id}"')[1].split("</tr>")[0]
    assert 'pill ok">done' in row and f"{record.attempts} attempts" in row
    assert 'data-testid="superseded"' in row and run_1["worker"] in row
    recent = html.split('data-testid="occurrences"')[1].split("</table>")[0]
    line = recent.split(occurrence)[1].split("</tr>")[0]
    assert 'data-testid="superseded-run"' in line and f"fencing token {first}" in line and run_1["worker"] in line
    kv.close()
    journal.close()
