"""``manage.py botmesh_run`` (the README's run command): what it says when it cannot load the demo."""

from __future__ import annotations

import contextlib
import http.server
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.faults.servers import Processes, free_port, migrated_copy, project_env, python
from tests.polling import wait_until

ROOT = Path(__file__).resolve().parents[2]


def test_missing_demo_fixtures_stop_the_start_with_one_line_naming_the_fix(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "BOTMESH_FIXTURES": str(tmp_path / "nowhere"),
        "BOTMESH_DATA_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "botmesh_admin.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite3",
    }
    done = subprocess.run(
        [sys.executable, "manage.py", "botmesh_run", "--port", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert f"demo fixtures not found in {tmp_path / 'nowhere'}" in done.stderr
    assert "BOTMESH_FIXTURES" in done.stderr and "--no-demo" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "logs").exists(), "nothing was started"


class _AnswersEverything(http.server.BaseHTTPRequestHandler):
    """Another server on the port: it even answers ``/readyz`` with 200 (a second admin, say)."""

    def do_GET(self) -> None:
        body = b'{"status": "ready"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_taken_port_stops_the_start_at_once_naming_the_port_and_how_to_choose_another(tmp_path: Path) -> None:
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AnswersEverything)
    port = other.server_address[1]
    threading.Thread(target=other.serve_forever, daemon=True).start()
    env = {**project_env(tmp_path), "BOTMESH_DATA_DIR": str(tmp_path / "data")}
    try:
        started = time.monotonic()
        done = subprocess.run([sys.executable, "manage.py", "botmesh_run", "--no-demo", "--port", str(port)],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    finally:
        other.shutdown()
        other.server_close()
    assert done.returncode != 0, done.stdout
    assert "is running at" not in done.stdout
    [line] = done.stderr.strip().splitlines()
    assert f"port {port} of 127.0.0.1 is already in use" in line
    assert f"--port {port + 1}" in line and f"BOTMESH_PORT={port + 1}" in line
    assert not (tmp_path / "data" / "logs").exists(), "nothing was started"
    assert time.monotonic() - started < 30


def test_a_second_run_on_the_same_data_dir_is_refused_naming_the_running_pid(tmp_path: Path) -> None:
    """The first run is stood in for by a process holding the data dir's run lock, as a running one does."""
    data = tmp_path / "data"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from pathlib import Path\n"
         "from botmesh_admin.dashboard.management.commands.botmesh_run import hold_run_lock\n"
         "lock = hold_run_lock(Path(sys.argv[1])); print('held', flush=True); time.sleep(60)", str(data)],
        cwd=ROOT, env=project_env(tmp_path), stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        env = {**project_env(tmp_path), "BOTMESH_DATA_DIR": str(data)}
        done = subprocess.run([sys.executable, "manage.py", "botmesh_run", "--no-demo", "--port", str(free_port())],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode != 0, done.stdout
    assert "is running at" not in done.stdout and "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert f"another ./dev run (pid {holder.pid}) is running on {data}" in line
    assert not (data / "logs").exists(), "nothing was started"


@pytest.mark.parametrize("port", ["99999", "0", "-1"])
def test_a_port_outside_1_to_65535_stops_the_start_naming_port_before_anything_starts(
    tmp_path: Path, port: str
) -> None:
    env = {**project_env(tmp_path), "BOTMESH_DATA_DIR": str(tmp_path / "data")}
    done = subprocess.run([sys.executable, "manage.py", "botmesh_run", "--no-demo", "--port", port],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0, done.stdout
    assert "is running at" not in done.stdout and "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert f"--port: must be 1..65535, not {port}" in line
    assert not (tmp_path / "data" / "logs").exists(), "nothing was started"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)  # no open transaction: the copy needs none
def test_no_demo_prints_only_what_exists_and_a_web_whose_port_got_taken_stops_the_stack(tmp_path: Path) -> None:
    port = free_port()
    env = {**project_env(tmp_path), "BOTMESH_DRAIN_TIMEOUT": "5"}
    (tmp_path / "data").mkdir()
    migrated_copy(tmp_path / "data" / "db.sqlite3")
    with Processes(tmp_path) as procs:
        run = procs.start("run", [python(), "manage.py", "botmesh_run", "--no-demo", "--port", str(port)], env)
        try:
            wait_until(lambda: run.poll() is None and "Ctrl-C stops everything" in procs.log("run"),
                       "botmesh_run to start web, worker and beat", timeout_s=60)  # fmt: skip
            printed = procs.log("run")
            assert f"botmesh-admin is running at http://127.0.0.1:{port}/" in printed
            assert "tienda" not in printed and "botmesh-demo" not in printed and "log in as" not in printed
            assert "no user yet: python manage.py createsuperuser" in printed
            pids = {name: int(pid) for name, pid in re.findall(r"(web|worker|beat) pid (\d+)", printed)}
            os.kill(pids["web"], signal.SIGKILL)
            with socket.socket() as squatter:  # another program takes the port before web is restarted
                squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                wait_until(lambda: _bound(squatter, port), "the port to be free for the squatter", timeout_s=5)
                squatter.listen()
                run.wait(timeout=30)
        except BaseException:
            print(procs.log("run")[-4000:])
            raise
        log = procs.log("run")
    assert run.returncode != 0, log
    assert re.search(
        rf"web cannot start: port {port} of 127.0.0.1 is already in use .*--port {port + 1} "
        rf"or BOTMESH_PORT={port + 1} \(3 starts in a row failed; stopping everything\)",
        log,
    ), log
    assert log.count("web restarted") == 0
    for name, pid in pids.items():
        wait_until(lambda pid=pid: not _alive(pid), f"{name} to stop", timeout_s=10)


def _bound(sock: socket.socket, port: int) -> bool:
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):  # a zombie is dead: its parent has not reaped it yet
        if Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z"):
            return False
    return True


def test_a_child_that_keeps_exiting_before_it_serves_stops_with_its_logs_last_line(tmp_path: Path) -> None:
    from botmesh_admin.dashboard.management.commands.botmesh_run import Child, StartFailed

    argv = [sys.executable, "-c", "import sys; print('starting'); print('Error: cannot open the thing'); sys.exit(3)"]
    child = Child("web", argv, tmp_path / "web.log", dict(os.environ), tmp_path, serving=lambda: False)
    child.served = True  # it had served once (the first start): its crash is restarted with the backoff
    lines: list[str] = []
    deadline = time.monotonic() + 20
    with pytest.raises(StartFailed) as failed:
        while time.monotonic() < deadline:
            news = child.supervise(time.monotonic())
            if news:
                lines.append(news)
            time.sleep(0.05)
    assert str(failed.value) == (
        f"web exited with status 3 before it served; last line of {tmp_path / 'web.log'}: "
        "Error: cannot open the thing (3 starts in a row failed; stopping everything)"
    )
    assert [re.sub(r"pid \d+", "pid N", line) for line in lines if "restarted" in line] == [
        f"web restarted (pid N, restart {n})" for n in (1, 2, 3)
    ]  # then the third start in a row that never served stopped it


def test_a_child_that_served_and_then_crashed_is_restarted_with_the_backoff(tmp_path: Path) -> None:
    from botmesh_admin.dashboard.management.commands.botmesh_run import Child, _accepts

    port = free_port()
    serves_then_crashes = ("import socket, sys, time; s = socket.socket(); "
                           "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
                           f"s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(1); sys.exit(1)")  # fmt: skip
    child = Child("web", [sys.executable, "-c", serves_then_crashes], tmp_path / "web.log", dict(os.environ),
                  tmp_path, serving=lambda: _accepts("127.0.0.1", port))  # fmt: skip
    deadline = time.monotonic() + 30
    while child.restarts < 3:  # 1 + 2 + 4 s of backoff: each start served, so none counts as a failed start
        assert time.monotonic() < deadline, child.restarts
        child.supervise(time.monotonic())
        time.sleep(0.05)
    assert child.start_failures == 0 and child.delay_s == 8
    child.proc.kill()
    child.proc.wait()


def _with_demo_tenant(tmp_path: Path, env: dict[str, str]) -> None:
    """A migrated data dir whose database has the demo tenant (what the bot replicas need) without the demo."""
    (tmp_path / "data").mkdir()
    migrated_copy(tmp_path / "data" / "db.sqlite3")
    subprocess.run([python(), "manage.py", "botmesh_tenant", "create", "tienda", "--name", "Tienda"],
                   cwd=ROOT, env=env, check=True, capture_output=True, timeout=60)  # fmt: skip


def _bot_replicas(tmp_path: Path) -> list:
    from botmesh_admin.coordination.base import bot_prefix
    from botmesh_admin.coordination.runtime import backend_from_url

    backend = backend_from_url(f"kv:sqlite:///{tmp_path}/data/kv.sqlite3", bot_prefix("tienda", "tienda-bot"))
    try:
        return backend.snapshot(10_000).replicas  # type: ignore[no-any-return]
    finally:
        backend.close()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_demo_bot_runs_as_n_supervised_replica_processes_over_the_embedded_coordinator(tmp_path: Path) -> None:
    port = free_port()
    env = {**project_env(tmp_path), "BOTMESH_DRAIN_TIMEOUT": "5"}
    _with_demo_tenant(tmp_path, env)
    argv = [python(), "manage.py", "botmesh_run", "--no-demo", "--port", str(port), "--bot-replicas", "2"]
    with Processes(tmp_path) as procs:
        run = procs.start("run", argv, env)
        try:
            wait_until(lambda: run.poll() is None and "Ctrl-C stops everything" in procs.log("run"),
                       "botmesh_run to start", timeout_s=60)  # fmt: skip
            printed = procs.log("run")
            found = re.search(r"tienda-bot replicas: bot-1 pid (\d+), bot-2 pid (\d+)  \(kill -9 one, then open "
                              rf"http://127.0.0.1:{port}/t/tienda/replicas/\)", printed)  # fmt: skip
            assert found, printed
            pids = [int(pid) for pid in found.groups()]
            # Secrets never on the command line (ps shows it to every user): the coordinator and Kv URLs (a
            # PostgreSQL or Redis one holds user:password@) and the token reach the replicas in their environment.
            kv_url = env.get("BOTMESH_KV_URL") or "sqlite:///"
            for pid in pids:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
                assert not any(re.search(r"://[^/@\s]*:[^/@\s]*@", arg) for arg in cmdline), cmdline
                assert "--coordination" not in cmdline and not any(kv_url in arg or "bm_" in arg for arg in cmdline)
                environ = dict(
                    item.split("=", 1)
                    for item in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
                    if item
                )
                assert environ["BOTMESH_COORDINATION_URL"].startswith("kv:") and environ["BOTMESH_BOT_TOKEN"]
            # Both register under the bot's prefix in the Kv, as replicas tienda-bot-1 and -2 of role bot.
            wait_until(lambda: len(_bot_replicas(tmp_path)) == 2, "two bot replicas to heartbeat", timeout_s=30)
            replicas = _bot_replicas(tmp_path)
            assert sorted((r.replica_id, r.role, r.pid) for r in replicas) == [
                ("tienda-bot-1", "bot", pids[0]),
                ("tienda-bot-2", "bot", pids[1]),
            ]
            wait_until(lambda: sum("provider:main" in r.leads for r in _bot_replicas(tmp_path)) == 1,
                       "one replica to lead provider:main", timeout_s=30)  # fmt: skip
            os.kill(pids[0], signal.SIGKILL)  # a killed replica is started again, as tienda-bot-1 anew
            wait_until(lambda: "bot-1 restarted" in procs.log("run"), "bot-1 to be restarted", timeout_s=30)
            reborn = lambda: any(r.replica_id == "tienda-bot-1" and r.pid != pids[0] for r in _bot_replicas(tmp_path))  # noqa: E731
            wait_until(reborn, "the new tienda-bot-1 to heartbeat", timeout_s=30)
            assert (tmp_path / "data" / "logs" / "bot-2.log").read_text().count("started") == 1
            new_pid = int(re.search(r"bot-1 restarted \(pid (\d+)", procs.log("run")).group(1))
            run.send_signal(signal.SIGINT)
            run.wait(timeout=60)
        except BaseException:
            print(procs.log("run")[-4000:])
            raise
    assert run.returncode == 0, procs.log("run")
    for pid in (new_pid, pids[1]):
        wait_until(lambda pid=pid: not _alive(pid), f"bot pid {pid} to stop", timeout_s=10)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_bot_replicas_0_starts_no_bot(tmp_path: Path) -> None:
    port = free_port()
    env = {**project_env(tmp_path), "BOTMESH_DRAIN_TIMEOUT": "5"}
    _with_demo_tenant(tmp_path, env)
    argv = [python(), "manage.py", "botmesh_run", "--no-demo", "--port", str(port), "--bot-replicas", "0"]
    with Processes(tmp_path) as procs:
        run = procs.start("run", argv, env)
        try:
            wait_until(lambda: run.poll() is None and "Ctrl-C stops everything" in procs.log("run"),
                       "botmesh_run to start", timeout_s=60)  # fmt: skip
            run.send_signal(signal.SIGINT)
            run.wait(timeout=60)
        except BaseException:
            print(procs.log("run")[-4000:])
            raise
        printed = procs.log("run")
    assert "tienda-bot replicas" not in printed and "bot-1" not in printed, printed
    assert not list((tmp_path / "data" / "logs").glob("bot-*.log"))
    assert _bot_replicas(tmp_path) == []


def test_the_two_workers_are_one_command_line_differing_only_in_name_queues_and_concurrency() -> None:
    """``worker`` consumes celery and bulk with 2 processes, ``worker-live`` live with 1 (as before the builder)."""
    from botmesh_admin.dashboard.management.commands.botmesh_run import celery_worker_command

    head = ["py", "-m", "celery", "-A", "botmesh_admin", "worker", "-l", "INFO", "--concurrency"]
    assert celery_worker_command("py", name="worker", queues=("celery", "bulk"), concurrency=2) == [
        *head, "2", "-n", "worker@%h", "-Q", "celery,bulk",
    ]  # fmt: skip
    assert celery_worker_command("py", name="live", queues=("live",), concurrency=1) == [
        *head, "1", "-n", "live@%h", "-Q", "live",
    ]  # fmt: skip
