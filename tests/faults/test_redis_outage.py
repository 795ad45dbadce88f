"""A Celery worker rides out a Redis outage while it holds an unacknowledged task (issue 17, item 3).

Regression: with celery 5.7.0 (kombu 5.7.0) the worker exited with
``AttributeError: 'NoneType' object has no attribute 'hostname'`` when Redis
went away under a task it had not acknowledged; pyproject.toml keeps
``celery<5.7``. Here a real worker (botmesh_admin's Celery app: late acks,
prefetch 1) consumes from a Redis of the test's own (append-only file on, as
production runs it); the worker holds a task that blocks until told; Redis is
SIGKILLed and started again on the same port. Then the worker must still be
running and consuming (a task sent after the restart runs) and the held task
must not be lost (it runs to its end, once).
"""

from __future__ import annotations

import collections
import subprocess
import time
from pathlib import Path

import pytest
from celery import Celery

from tests.polling import wait_until

from .servers import Processes, fault_report, project_env, python

pytestmark = pytest.mark.slow


def runs(directory: Path, log: str) -> collections.Counter[str]:
    path = directory / log
    lines = path.read_text().splitlines() if path.exists() else []
    return collections.Counter(line.split()[0] for line in lines)


def running(worker: subprocess.Popen[bytes], log: Path, when: str) -> bool:
    """Return True; fail the test at once if the worker has exited or is on its way out.

    (celery 5.7.0 logged "Unrecoverable error: AttributeError(...'hostname')" and
    began a warm shutdown, which waits for the held task: alive, but consuming nothing.)
    """
    assert worker.poll() is None, f"the worker exited (status {worker.returncode}) {when}"
    fatal = [line for line in log.read_text(errors="replace").splitlines() if "Unrecoverable error" in line]
    assert not fatal, f"the worker is shutting down {when}: {fatal[0]}"
    return True


def send(producer: Celery, url: str, task: str, label: str, timeout_s: float = 15.0) -> None:
    """Publish ``task(label)`` to the broker at ``url``, retrying while it is still coming back.

    (The URL is passed on each call: this test process's ``CELERY_BROKER_URL``
    — memory:// — would win over the app's own setting.)
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with producer.connection_for_write(url) as connection:
                producer.send_task(task, args=[label], connection=connection, retry=False)
            return
        except Exception:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def test_worker_holding_a_task_survives_redis_killed_and_restarted(tmp_path: Path) -> None:
    started = time.monotonic()
    with Processes(tmp_path) as procs:
        redis = procs.redis(appendonly=True)
        env = {
            **project_env(tmp_path), "CELERY_BROKER_URL": redis.url, "REDIS_URL": redis.url,
            "FAULTS_DIR": str(tmp_path),
        }  # fmt: skip
        worker = procs.start("worker", [
            python(), "-m", "celery", "-A", "tests.faults.worker_app", "worker", "-l", "INFO", "-c", "2",
            "-n", "faults@%h", "--without-mingle", "--without-gossip",
        ], env)  # fmt: skip
        log = tmp_path / "worker.log"
        producer = Celery("faults-producer", set_as_current=False)
        try:
            send(producer, redis.url, "tests.faults.mark", "before")
            wait_until(lambda: runs(tmp_path, "done.log")["before"] == 1, "the worker to consume", timeout_s=40)
            send(producer, redis.url, "tests.faults.hold", "held")
            wait_until(lambda: runs(tmp_path, "started.log")["held"] == 1, "the held task to start", timeout_s=15)

            redis.kill()  # with the held task unacknowledged
            time.sleep(2.0)  # the worker notices the outage
            running(worker, log, "when Redis went away")
            redis.start()  # same port, same append-only file

            # While the held task still runs: the free pool process must take the new task.
            send(producer, redis.url, "tests.faults.mark", "after")
            after = "after Redis came back"
            wait_until(lambda: running(worker, log, after) and runs(tmp_path, "done.log")["after"] >= 1,
                       "a task sent after the restart to run beside the held one", timeout_s=20)  # fmt: skip
            (tmp_path / "release-held").touch()
            wait_until(lambda: running(worker, log, after) and runs(tmp_path, "done.log")["held"] >= 1,
                       "the held task to finish", timeout_s=20)  # fmt: skip
            time.sleep(1.0)  # room for a redelivery of the held task to show up as a duplicate
            running(worker, log, after)
        except BaseException:
            print(procs.log("worker")[-6000:])
            raise
        finally:
            producer.close()
        unacked = _unacked(redis.port)

    done = runs(tmp_path, "done.log")
    sent = ["before", "held", "after"]
    duplicates = sum(max(0, done[label] - 1) for label in sent)
    lost = [label for label in sent if done[label] == 0]
    fault_report(f"FAULT redis-outage: sent {len(sent)}, ran {sum(done[label] for label in sent)}, "
          f"duplicates {duplicates}, lost {len(lost)}, unacked left in Redis {unacked}, "
          f"{time.monotonic() - started:.1f} s")  # fmt: skip
    assert lost == [] and duplicates == 0, done
    assert unacked == 0, "a message left unacknowledged in Redis would be redelivered (a duplicate) later"


def _unacked(port: int) -> int:
    import redis

    client = redis.Redis(port=port, socket_timeout=5)
    try:
        return int(client.hlen("unacked"))
    finally:
        client.close()
