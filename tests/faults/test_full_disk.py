"""A full disk on the embedded default is survivable (issue 17, item 5).

With the data dir on a 20 MB filesystem, kombu's filesystem broker left
zero-byte message files, the worker crashed on them (``JSONDecodeError``),
``botmesh_run`` stopped web and beat, and every restart crashed on the next
empty file. Here: a corrupt or empty broker message is set aside and a real
worker keeps consuming; a publish that meets ``ENOSPC`` on a real tiny
filesystem leaves no message file; ``/readyz`` says "disk full" (a write
check) and is ready again once space is freed; ``botmesh_run`` restarts a
child that died instead of stopping the stack.

The tiny filesystem is a tmpfs mounted for the test (root only; the test is
skipped — failed under ``BOTMESH_REQUIRE_SERVICES=1`` — where it cannot mount).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import re
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from django.test import Client
from kombu import Connection
from kombu.exceptions import OperationalError

from botmesh_admin.filesystem_broker import decode_message
from tests import services
from tests.polling import wait_until

from .servers import Processes, fault_report, free_port, migrated_copy, project_env, python

pytestmark = pytest.mark.slow

FILESYSTEM_TRANSPORT = "botmesh_admin.filesystem_broker:Transport"


# -- helpers ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def tiny_filesystem(size_mb: int = 20) -> Iterator[Path]:
    """Mount a ``size_mb`` MB tmpfs on a fresh directory; unmount it afterwards, also on failure."""
    mount_point = Path(tempfile.mkdtemp(prefix="botmesh-fault-disk-"))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        mount_point.rmdir()
        reason = f"cannot mount a {size_mb} MB tmpfs here ({done.stderr.strip() or 'not root'})"
        if services.REQUIRE:
            pytest.fail(f"BOTMESH_REQUIRE_SERVICES=1 but {reason}")
        pytest.skip(reason)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)
        mount_point.rmdir()


def fill(directory: Path) -> Path:
    """Write a file in ``directory`` until the filesystem is full; return it (delete it to free the space)."""
    filler = directory / "filler"
    chunk = b"\0" * (1 << 20)
    with open(filler, "wb", buffering=0) as out:
        try:
            while True:
                out.write(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    with contextlib.suppress(OSError), open(filler, "ab", buffering=0) as out:  # the last partial page too
        while True:
            out.write(b"\0" * 512)
            out.flush()
    return filler


def broker_options(broker: Path) -> dict[str, object]:
    """The transport options of ``settings.py`` for a broker folder ``broker``."""
    return {
        "data_folder_in": str(broker / "queue"), "data_folder_out": str(broker / "queue"),
        "processed_folder": str(broker / "processed"), "control_folder": str(broker / "control"),
        "corrupt_folder": str(broker / "corrupt"), "store_processed": False,
    }  # fmt: skip


def publish(broker: Path, label: str) -> None:
    """Send ``tests.faults.mark(label)`` through the filesystem broker in ``broker``, as the web process does."""
    producer = Celery("faults-producer", set_as_current=False)
    with Connection("filesystem://", transport=FILESYSTEM_TRANSPORT, transport_options=broker_options(broker)) as conn:
        producer.send_task("tests.faults.mark", args=[label], connection=conn, retry=False)


def messages(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.endswith(".msg")) if folder.is_dir() else []


def done(directory: Path) -> collections.Counter[str]:
    """Count the tasks the worker finished, by label."""
    path = directory / "done.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return collections.Counter(line.split()[0] for line in lines)


# -- the broker ------------------------------------------------------------------------------------


def test_corrupt_broker_messages_are_set_aside_and_a_real_worker_keeps_consuming(tmp_path: Path) -> None:
    broker = tmp_path / "data" / "broker"
    for name in ("queue", "processed"):
        (broker / name).mkdir(parents=True)
    # What a full disk left in the queue, ahead of the next message: an empty file and a truncated
    # one. (Consumers take files in name order; kombu's names start with a number without leading zeros.)
    (broker / "queue" / f"01_{uuid.uuid4()}.celery.msg").write_bytes(b"")
    (broker / "queue" / f"02_{uuid.uuid4()}.celery.msg").write_bytes(b'{"body": "eyJhcmdz')
    publish(broker, "first")
    env = {**project_env(tmp_path), "CELERY_BROKER_URL": "filesystem://", "FAULTS_DIR": str(tmp_path)}
    with Processes(tmp_path) as procs:
        worker = procs.start("worker", [
            python(), "-m", "celery", "-A", "tests.faults.worker_app", "worker", "-l", "INFO", "-c", "1",
            "-n", "faults-fs@%h", "--without-mingle", "--without-gossip",
        ], env)  # fmt: skip
        try:
            wait_until(lambda: worker.poll() is None and done(tmp_path)["first"] == 1,
                       "the worker to run the message behind the corrupt ones", timeout_s=40)  # fmt: skip
            # And one more while it runs, ahead of a new message.
            (broker / "queue" / f"03_{uuid.uuid4()}.celery.msg").write_bytes(b"\0" * 64)
            publish(broker, "second")
            wait_until(lambda: worker.poll() is None and done(tmp_path)["second"] == 1,
                       "the worker to go on consuming", timeout_s=20)  # fmt: skip
        except BaseException:
            print(procs.log("worker")[-6000:])
            raise
        log = procs.log("worker")
        assert worker.poll() is None, "the worker exited"
    aside = sorted(p.name for p in (broker / "corrupt").iterdir())
    set_aside_lines = [line for line in log.splitlines() if "moved to" in line and "broker file" in line]
    fault_report(f"FAULT corrupt-broker-files: sent 2, corrupt 3, ran {sum(done(tmp_path).values())}, "
          f"set aside {len(aside)}, worker alive")  # fmt: skip
    assert [name.split("_")[0] for name in aside] == ["01", "02", "03"]
    assert len(set_aside_lines) == 3, set_aside_lines
    assert "is empty" in set_aside_lines[0] and "not a valid message" in set_aside_lines[1]
    assert "JSONDecodeError" not in log
    assert messages(broker / "queue") == []


def test_a_publish_on_a_full_disk_leaves_no_message_file_and_works_once_space_is_freed() -> None:
    with tiny_filesystem(size_mb=2) as disk:
        broker = disk / "broker"
        for name in ("queue", "processed"):
            (broker / name).mkdir(parents=True)
        publish(broker, "before")  # binds the queue (the exchange table) while there is room
        filler = fill(disk)
        with pytest.raises(OperationalError, match="No space left"):  # what ``.delay()`` raises
            publish(broker, "full")
        leftovers = [p.name for p in (broker / "queue").iterdir()]
        assert len(leftovers) == 1 and leftovers[0].endswith(".celery.msg"), leftovers  # only "before"
        filler.unlink()
        publish(broker, "after")
        found = [decode_message(p.read_bytes()) for p in messages(broker / "queue")]
        assert len(found) == 2 and all(m is not None for m in found)


# -- readiness -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_readyz_says_disk_full_and_webhooks_answer_503_until_space_is_freed(
    client: Client, settings, tenant_id: str
) -> None:
    from botmesh_admin.channels import whatsapp
    from botmesh_admin.channels.services import channel_config_set
    from botmesh_admin.events import connect_journal, use_journal
    from botmesh_admin.tenancy.services import tenant_create

    tenant_create(tenant_id, name="Full disk")
    channel_config_set(tenant_id, kind="whatsapp", name="main", phone_number_id="106540352242922",
                       app_secret="disk-secret")  # fmt: skip

    def webhook(n: int) -> tuple[int, str | None]:
        raw = (
            b'{"object":"whatsapp_business_account","entry":[{"id":"1","changes":[{"field":"messages",'
            b'"value":{"metadata":{"phone_number_id":"106540352242922"},"messages":[{"from":"573001112233",'
            b'"id":"wamid.disk%d","timestamp":"1764489600","type":"text","text":{"body":"hola"}}]}}]}]}' % n
        )
        response = client.post(
            f"/webhooks/whatsapp/{tenant_id}",
            raw,
            content_type="application/json",
            headers={whatsapp.SIGNATURE_HEADER: whatsapp.signature(raw, "disk-secret")},
        )
        return response.status_code, response.json().get("error")

    with tiny_filesystem(size_mb=20) as disk:
        settings.BOTMESH_DATA_DIR = disk
        journal = connect_journal(f"sqlite:///{disk}/journal.sqlite3")  # the embedded default's journal
        try:
            with use_journal(journal):
                assert client.get("/readyz").status_code == 200 and webhook(1) == (200, None)
                filler = fill(disk)
                full = client.get("/readyz")
                full_webhook = webhook(2)
                filler.unlink()
                again = client.get("/readyz")
                again_webhook = webhook(2)  # Meta's retry of the refused one
                stored = len(journal.list(tenant=tenant_id))
            probes_left = list(disk.glob(".readyz-*"))
        finally:
            journal.close()
    fault_report(
        f"FAULT full-disk: readyz full {full.status_code} {full.json()['reason']!r}, webhook full "
        f"{full_webhook}, after freeing readyz {again.status_code} webhook {again_webhook}, stored {stored}"
    )
    assert full.status_code == 503
    assert full.json()["reason"] == f"disk full: no space left to write in {disk}"
    assert full.json()["checks"]["database"] == "ok"  # reads still work: only a write shows it
    assert full_webhook == (503, "store_unavailable")
    assert again.status_code == 200 and again.json()["checks"]["disk"] == "ok"
    assert again_webhook == (200, None) and stored == 2  # served again, no manual step
    assert probes_left == []  # the probe file is deleted, also when its write failed


# -- botmesh_run -----------------------------------------------------------------------------------


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):  # a zombie is dead: its parent has not reaped it yet
        if Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z"):
            return False
    return True


@pytest.mark.django_db(transaction=True)  # no open transaction: the copy needs none
def test_botmesh_run_restarts_a_killed_child_and_ctrl_c_still_stops_all(tmp_path: Path) -> None:
    started = time.monotonic()
    port = free_port()
    env = {**project_env(tmp_path), "BOTMESH_DRAIN_TIMEOUT": "5"}
    (tmp_path / "data").mkdir()
    migrated_copy(tmp_path / "data" / "db.sqlite3")
    phases = {"migrated": time.monotonic() - started}
    with Processes(tmp_path) as procs:
        run = procs.start("run", [python(), "manage.py", "botmesh_run", "--no-demo", "--port", str(port)], env)
        try:
            wait_until(lambda: run.poll() is None and "is running at" in procs.log("run"),
                       "botmesh_run to start web, worker and beat", timeout_s=60)  # fmt: skip
            phases["running"] = time.monotonic() - started
            pids = {name: int(pid) for name, pid in re.findall(r"(web|worker|beat) pid (\d+)", procs.log("run"))}
            worker_log = tmp_path / "data" / "logs" / "worker.log"
            os.kill(pids["worker"], signal.SIGKILL)  # a crash, as on the full disk
            before_restart = len(worker_log.read_bytes())
            wait_until(lambda: "worker restarted (pid" in procs.log("run"), "botmesh_run to restart the worker",
                       timeout_s=20)  # fmt: skip
            [new_pid] = [int(p) for p in re.findall(r"worker restarted \(pid (\d+)", procs.log("run"))]
            assert run.poll() is None and _alive(new_pid) and _alive(pids["web"]) and _alive(pids["beat"])
            assert _get(f"http://127.0.0.1:{port}/readyz") == 200  # web went on serving
            wait_until(lambda: b" ready." in worker_log.read_bytes()[before_restart:],
                       "the restarted worker to be ready", timeout_s=30)  # fmt: skip
            phases["restarted"] = time.monotonic() - started
            os.kill(run.pid, signal.SIGINT)  # Ctrl-C
            run.wait(timeout=30)
        except BaseException:
            print(procs.log("run")[-4000:])
            raise
        log = procs.log("run")
    assert run.returncode == 0, log
    for name, pid in {**pids, "worker": new_pid}.items():
        wait_until(lambda pid=pid: not _alive(pid), f"{name} to stop on Ctrl-C", timeout_s=10)
    assert re.search(r"worker exited with status -9; restarting it in 1 s \(see .*worker\.log\)", log), log
    fault_report(
        f"FAULT botmesh-run-child-killed: killed 1, restarted 1, web answered 200, stopped all on Ctrl-C, "
        f"{time.monotonic() - started:.1f} s ({', '.join(f'{k} at {v:.1f} s' for k, v in phases.items())})"
    )
