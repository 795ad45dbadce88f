"""``manage.py botmesh_run``: the embedded default — web, Celery worker and beat in one command.

Starts the three processes on the embedded backends (SQLite, filesystem broker),
waits for ``/readyz``, loads the demo tenant through the real HTTP endpoints
(``--no-demo`` to skip), prints the URL and the login, and on Ctrl-C (SIGINT)
or SIGTERM stops all three, workers first draining what they hold.

Once the stack is up, a child that exits is started again, not the end of the
stack: after ``RESTART_FIRST_S`` seconds, doubling on each crash up to
``RESTART_MAX_S`` (back to the first delay once a child has run for
``RESTART_RESET_S``), each crash and restart logged with its log file. A child
that exits during start-up still stops the command with its status (a
configuration error must be seen at once).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from botmesh_admin import demo

RESTART_FIRST_S = 1.0
RESTART_MAX_S = 30.0
RESTART_RESET_S = 60.0


class Child:
    """One supervised child: its command, its log file, the running process and its restart backoff."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str], cwd: Path) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.env = env
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] = self._spawn()
        self.started = time.monotonic()
        self.delay_s = RESTART_FIRST_S
        self.restart_at: float | None = None  # when the crashed process is started again
        self.restarts = 0

    def _spawn(self) -> subprocess.Popen[bytes]:
        with open(self.log_path, "ab") as log:  # the child keeps its own copy of the descriptor
            return subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd, env=self.env,
                start_new_session=True,  # Ctrl-C reaches only us; each child gets one SIGTERM on stop
            )  # fmt: skip

    def supervise(self, now: float) -> str | None:
        """Notice a crash or restart a crashed child; return a line to log, or ``None``."""
        if self.restart_at is None:
            status = self.proc.poll()
            if status is None:
                return None
            if now - self.started >= RESTART_RESET_S:
                self.delay_s = RESTART_FIRST_S  # it had been running fine: a fresh crash, not a loop
            self.restart_at = now + self.delay_s
            return (f"{self.name} exited with status {status}; restarting it in {self.delay_s:.0f} s "
                    f"(see {self.log_path})")  # fmt: skip
        if now < self.restart_at:
            return None
        self.proc = self._spawn()
        self.started = now
        self.restart_at = None
        self.restarts += 1
        self.delay_s = min(self.delay_s * 2, RESTART_MAX_S)
        return f"{self.name} restarted (pid {self.proc.pid}, restart {self.restarts})"


class Command(BaseCommand):
    help = "Run the admin (web + Celery worker + Celery beat) on the embedded default."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=settings.CONFIG.port)
        parser.add_argument("--no-demo", action="store_true", help="do not load the demo tenant")
        parser.add_argument(
            "--reload-demo", action="store_true",
            help="load the demo data again even if an earlier start loaded it (overwrites your edits)",
        )
        parser.add_argument("--exit-after-load", action="store_true", help="stop once the demo is loaded (smoke test)")

    def handle(self, *args, **opts) -> None:  # type: ignore[no-untyped-def]
        base_url = f"http://{opts['host']}:{opts['port']}"
        fixtures = demo.fixtures_dir()
        if not opts["no_demo"] and not (fixtures / "ledger" / "messages.jsonl").is_file():
            raise CommandError(
                f"demo fixtures not found in {fixtures}: set BOTMESH_FIXTURES to the shared fixtures folder "
                "(../shared/fixtures next to this repository), or start with --no-demo"
            )
        self._reindex()
        py = sys.executable
        log_dir = settings.BOTMESH_DATA_DIR / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        commands = {
            "web": [py, "manage.py", "runserver", f"{opts['host']}:{opts['port']}", "--noreload"],
            "worker": [py, "-m", "celery", "-A", "botmesh_admin", "worker", "-l", "INFO",
                       "--concurrency", "2", "-n", "worker@%h"],
            "beat": [py, "-m", "celery", "-A", "botmesh_admin", "beat", "-l", "INFO"],
        }
        env = dict(os.environ, PYTHONUNBUFFERED="1")  # live log files
        children = {
            name: Child(name, cmd, log_dir / f"{name}.log", env, Path(settings.BASE_DIR))
            for name, cmd in commands.items()
        }

        stopping = False

        def stop(signum: int, frame: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        try:
            self._wait_ready(base_url, {name: child.proc for name, child in children.items()})
            summaries: list[str] = []
            if not opts["no_demo"]:
                tokens = demo.ensure_accounts()
                earlier = demo.demo_loaded()
                if earlier and not opts["reload_demo"]:
                    summaries = ["already loaded by an earlier start; your edits are kept (--reload-demo loads it again)"]
                else:
                    summaries = demo.load_over_http(base_url, tokens)
                    demo.mark_demo_loaded(summaries)
            self.stdout.write("")
            self.stdout.write(self.style.SUCCESS(f"botmesh-admin is running at {base_url}/"))
            self.stdout.write(f"  log in as {demo.ADMIN_USER} / {demo.ADMIN_PASSWORD} (admin) "
                              f"or {demo.AGENT_USER} / {demo.AGENT_PASSWORD} (agent)")
            self.stdout.write(f"  demo tenant: {base_url}/t/{demo.DEMO_TENANT}/   API docs: {base_url}/api/v1/docs")
            for line in summaries:
                self.stdout.write(f"  demo: {line}")
            self.stdout.write(f"  web, worker and beat logs: {log_dir}/   Ctrl-C stops everything")
            self.stdout.write("  " + ", ".join(f"{name} pid {child.proc.pid}" for name, child in children.items()))
            self.stdout.flush()
            while not stopping and not opts["exit_after_load"]:
                for child in children.values():
                    news = child.supervise(time.monotonic())
                    if news is not None:
                        self.stderr.write(news)
                        self.stderr.flush()
                time.sleep(0.5)
        finally:
            self._stop({name: child.proc for name, child in children.items()})

    def _reindex(self) -> None:
        """Build the Kv indexes an installation from an earlier version lacks (with progress)."""
        from .botmesh_reindex import tenant_ids, unbuilt

        call_command("botmesh_upgrade", stdout=self.stdout, verbosity=0)  # kernel tables of earlier versions (idempotent)
        missing = unbuilt(tenant_ids(None))
        if missing:
            self.stdout.write(f"building {len(missing)} Kv index(es) over existing data first ...")
            call_command("botmesh_reindex", stdout=self.stdout)
        self._assign_channels()

    def _assign_channels(self) -> None:
        """Give conversations of an earlier version their channel, until none is left (then never again)."""
        from inbox.management.commands.botmesh_assign_channels import Command as AssignChannels

        marker = settings.BOTMESH_DATA_DIR / "upgrades" / "channels-assigned"
        if marker.exists():
            return
        command = AssignChannels(stdout=self.stdout, stderr=self.stderr)
        call_command(command, verbosity=0)
        if command.left == 0:  # a conversation left (several numbers) is named at every start until assigned
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text("botmesh_assign_channels: every conversation has its channel\n")

    def _wait_ready(self, base_url: str, procs: dict[str, subprocess.Popen[bytes]]) -> None:
        deadline = time.monotonic() + 90
        last = ""
        while time.monotonic() < deadline:
            for name, proc in procs.items():
                if proc.poll() is not None:
                    raise CommandError(f"{name} exited with status {proc.returncode} during start-up")
            try:
                with urllib.request.urlopen(f"{base_url}/readyz", timeout=5) as resp:
                    if resp.status == 200:
                        return
            except urllib.error.HTTPError as exc:
                last = json.loads(exc.read() or b"{}").get("reason", "")
            except OSError as exc:
                last = str(exc)
            time.sleep(0.5)
        raise CommandError(f"web did not become ready: {last}")

    def _stop(self, procs: dict[str, subprocess.Popen[bytes]]) -> None:
        self.stdout.write("stopping web, worker and beat …")
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + settings.BOTMESH_DRAIN_TIMEOUT_S + 5
        for proc in procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
        self.stdout.write("stopped.")
