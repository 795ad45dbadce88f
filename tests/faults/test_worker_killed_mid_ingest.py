"""The events worker SIGKILLed mid-ingest loses no acknowledged webhook and stores none twice (issue 17, item 6).

This held before issue 17 (1,000 webhooks, the worker SIGKILLed twice: 1,000
stored once); kept as a bounded real-process test. The embedded layout of the
test's own (SQLite database, Kv and journal): gunicorn answers signed WhatsApp
webhooks of two tenants, ``manage.py botmesh_events_worker --channel inbound``
(lease 1 s, two of them) projects them. A worker is SIGKILLed twice in the
middle of a round of webhooks (while they keep arriving), and another one
started after the first kill. Every webhook answered 200 must be stored exactly
once, and every journal record end ``done``.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from botmesh_admin.channels import whatsapp
from botmesh_admin.events import connect_journal
from tests.polling import wait_until

from .servers import ROOT, Processes, fault_report, free_port, project_env, python
from .test_postgres_outage import APP_SECRET, SETUP, TENANTS, _wait_stored, body, request

pytestmark = pytest.mark.slow

PER_ROUND = 15  # webhooks per tenant and round; three rounds


def test_the_events_worker_sigkilled_twice_mid_ingest_stores_every_acknowledged_webhook_once(tmp_path: Path) -> None:
    started = time.monotonic()
    data = tmp_path / "data"
    data.mkdir()
    journal_url, kv_url = f"sqlite:///{data}/journal.sqlite3", f"sqlite:///{data}/kv.sqlite3"
    env = {**project_env(tmp_path), "BOTMESH_KV_URL": kv_url, "BOTMESH_JOURNAL_URL": journal_url,
           "CELERY_BROKER_URL": "memory://"}  # fmt: skip
    journal = connect_journal(journal_url)
    worker_argv = [python(), "manage.py", "botmesh_events_worker", "--channel", "inbound", "--lease-ms", "1000",
                   "--idle-ms", "50"]  # fmt: skip
    acked: dict[str, str] = {}
    answers: Counter[str] = Counter()
    kills: list[tuple[str, int, int]] = []  # (when, records done, webhooks acknowledged) at each kill

    def done() -> int:
        return sum(journal.counts(t).get(("done", "inbound"), 0) for t in TENANTS)

    with Processes(tmp_path) as procs:
        port = free_port()
        base = f"http://127.0.0.1:{port}"

        def post_round(first: int, midway: Callable[[], None] | None = None) -> None:
            for n in range(first, first + PER_ROUND):
                if n == first + PER_ROUND // 2 and midway is not None:
                    midway()
                for tenant in TENANTS:
                    wamid, raw = body(tenant, n)
                    answer = request(f"{base}/webhooks/whatsapp/{tenant}", raw, {
                        "Content-Type": "application/json",
                        whatsapp.SIGNATURE_HEADER: whatsapp.signature(raw, APP_SECRET),
                    })  # fmt: skip
                    answers["sent"] += 1
                    answers[str(answer.status)] += 1
                    if answer.status == 200:
                        acked[wamid] = tenant

        def kill(worker: subprocess.Popen[bytes], when: str) -> None:
            worker.send_signal(signal.SIGKILL)
            worker.wait(timeout=10)
            kills.append((when, done(), len(acked)))

        procs.start("web", [python(), "-m", "gunicorn", "botmesh_admin.wsgi", "-b", f"127.0.0.1:{port}", "-w", "1",
                            "--threads", "4", "--log-level", "warning"], env)  # fmt: skip
        # Two workers load at once (seconds each); a third starts after the first kill.
        workers = [procs.start("worker-1", worker_argv, env), procs.start("worker-2", worker_argv, env)]
        try:
            # The setup (migrate, tenants, channels) runs while they load; no webhook comes before it ends.
            setup = subprocess.run([python(), "-c", SETUP.format(tenants=TENANTS, secret=APP_SECRET)], cwd=ROOT,
                                   env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
            assert setup.returncode == 0, setup.stderr
            wait_until(lambda: request(f"{base}/healthz").status == 200, "gunicorn", timeout_s=60)
            for name in ("worker-1", "worker-2"):
                wait_until(lambda: "events worker draining" in procs.log(name), name, timeout_s=60)  # noqa: B023
            post_round(0)
            wait_until(lambda: done() > 0, "the workers to project", timeout_s=20)

            def kill_first() -> None:
                kill(workers[0], "worker-1 mid-round")
                workers.append(procs.start("worker-3", worker_argv, env))

            post_round(PER_ROUND, kill_first)
            post_round(2 * PER_ROUND, lambda: kill(workers[1], "worker-2 mid-round"))
            figures = _wait_stored(journal_url, acked, timeout_s=60, kv_url=kv_url)
        except BaseException:
            for name in ("web", "worker-1", "worker-2", "worker-3"):
                print(f"--- {name}\n{procs.log(name)[-3000:]}")
            raise
        finally:
            journal.close()
    fault_report(f"FAULT worker-sigkill-mid-ingest: sent {answers['sent']}, answered 200 {answers['200']}, "
                 f"acknowledged {len(acked)}, worker SIGKILLed {len(kills)}x "
                 f"({'; '.join(f'{w}: {d} of {a} projected' for w, d, a in kills)}), stored "
                 f"{figures['stored']}, processed {figures['done']}, duplicates {figures['duplicates']}, lost "
                 f"{figures['lost']}, {time.monotonic() - started:.1f} s")  # fmt: skip
    assert answers["sent"] == answers["200"] == 3 * PER_ROUND * len(TENANTS), answers
    assert len(kills) == 2
    assert (figures["stored"], figures["done"], figures["duplicates"], figures["lost"]) == (
        len(acked),
        len(acked),
        0,
        0,
    )
