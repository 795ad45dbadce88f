"""``manage.py botmesh_run``: the embedded default — web, Celery workers, beat and the demo bot in one command.

Starts web, a Celery worker for the ``celery`` and ``bulk`` queues, one for the
``live`` queue (``worker-live``: inbound messages and replies) and beat on the
embedded backends (SQLite, filesystem broker), waits for ``/readyz``, loads the
demo tenant through the real HTTP endpoints (``--no-demo`` to skip), prints the
URL and the login, and on Ctrl-C (SIGINT) or SIGTERM stops them all, workers
first draining what they hold.

Once the stack is up, a child that exits is started again, not the end of the
stack: after ``RESTART_FIRST_S`` seconds, doubling on each crash up to
``RESTART_MAX_S`` (back to the first delay once a child has run for
``RESTART_RESET_S``), each crash and restart logged with its log file. A child
that exits during start-up still stops the command with its status and its
log's last line (a configuration error must be seen at once).

The port is tried (a bind, as runserver binds) before anything starts: taken,
the command stops at once naming it and ``--port`` / ``BOTMESH_PORT``
(another server answering ``/readyz`` there looked like ours). Web is only
restarted while it can start: before each restart the port is tried again, and
a web that exits before it listened (or whose port is taken)
``START_FAILURES_MAX`` times in a row stops the stack with the reason — the
last line of ``web.log`` — instead of restarting forever. A web that had been
listening and then crashed is restarted with the backoff as before.

Once the demo tenant exists, the demo's ``tienda-bot`` runs as ``--bot-replicas``
(default ``BOT_REPLICAS``) supervised children ``bot-1`` … ``bot-N``
(``python -m botmesh_admin.botclient.demo_bot``, logs ``bot-<n>.log``), each a
replica ``tienda-bot-<n>`` coordinating over the embedded coordinator (the Kv:
``kv:<BOTMESH_KV_URL>``, or ``BOTMESH_COORDINATION_URL``) with a bot token bound to
``tienda-bot``, made at each start (the previous start's is revoked); the token and the
URLs reach the children in their environment, never their argv; ``--bot-replicas 0``
starts none.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from botmesh_admin import demo

RESTART_FIRST_S = 1.0
RESTART_MAX_S = 30.0
RESTART_RESET_S = 60.0
START_FAILURES_MAX = 3
BOT_REPLICAS = 3
BOT_MAX_REPLICAS = 20
BOT_TOKEN_NAME = "tienda-bot (./dev run)"
"""Restarts in a row of a child that never got to serve before the stack stops (1 + 2 + 4 s of backoff)."""


MIN_PORT, MAX_PORT = 1, 65535
"""The ports ``--port`` / ``BOTMESH_PORT`` may name (TCP's 16 bits; 0 would be "any free port")."""


class StartFailed(CommandError):
    """A supervised child keeps failing right at start (the message says why)."""


def port_refusal(host: str, port: int) -> str | None:
    """Return why ``host:port`` cannot be listened on (one line naming the fix), or ``None`` if it can.

    Binds with ``SO_REUSEADDR`` as runserver does, so a port whose last
    connections are in TIME_WAIT counts as free, one another program listens
    on as taken.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
    except OSError as exc:
        in_use = exc.errno == errno.EADDRINUSE
        reason = (
            "is already in use (another program listens on it)"
            if in_use
            else f"cannot be listened on ({exc.strerror or exc})"
        )
        return (f"port {port} of {host} {reason}: start on another with --port {port + 1} "
                f"or BOTMESH_PORT={port + 1}")  # fmt: skip
    return None


RUN_LOCK = "run.lock"
"""File in ``BOTMESH_DATA_DIR`` a running ``./dev run`` holds an exclusive ``flock`` on; it holds the pid."""


def hold_run_lock(data_dir: Path) -> IO[str]:
    """Take ``data_dir/run.lock`` for this process and return the open file (keep it open: the lock).

    Raises ``CommandError`` naming the running pid if another ``./dev run`` holds it: a second stack on
    the same ``var/`` would write into the first one's logs, database and Kv files. The kernel drops the
    lock when the holder exits, however it exits (no stale file to remove by hand).
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    lock = open(data_dir / RUN_LOCK, "a+", encoding="utf-8")  # noqa: SIM115 - kept open for the run
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        pid = lock.read().strip() or "unknown"
        lock.close()
        raise CommandError(
            f"another ./dev run (pid {pid}) is running on {data_dir}: stop it first (Ctrl-C), "
            "or start this one with another BOTMESH_DATA_DIR"
        ) from None
    lock.seek(0)
    lock.truncate()
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    return lock


def last_line(path: Path) -> str:
    """Return the last non-empty line of the log at ``path`` (its last 4 KiB read), or a note that it is empty."""
    try:
        with open(path, "rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - 4096))
            lines = [line.strip() for line in log.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError as exc:
        return f"(cannot read {path}: {exc.strerror})"
    return lines[-1] if lines else f"({path} is empty)"


class Child:
    """One supervised child: its command, its log file, the running process and its restart backoff."""

    def __init__(
        self, name: str, argv: list[str], log_path: Path, env: dict[str, str], cwd: Path,
        *, serving: Callable[[], bool] | None = None, refusal: Callable[[], str | None] | None = None,
    ) -> None:  # fmt: skip
        """``serving``: True once the child serves (web: its port accepts); without it a child counts as
        serving at once (worker and beat: restarted with the backoff however soon they die).
        ``refusal``: why the child cannot start now (web: its port is taken), checked before each restart.
        """
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.env = env
        self.cwd = cwd
        self.serving = serving
        self.refusal = refusal
        self.proc: subprocess.Popen[bytes] = self._spawn()
        self.started = time.monotonic()
        self.delay_s = RESTART_FIRST_S
        self.restart_at: float | None = None  # when the crashed process is started again
        self.restarts = 0
        self.served = serving is None
        self.start_failures = 0  # restarts in a row that never served

    def _spawn(self) -> subprocess.Popen[bytes]:
        with open(self.log_path, "ab") as log:  # the child keeps its own copy of the descriptor
            return subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd, env=self.env,
                start_new_session=True,  # Ctrl-C reaches only us; each child gets one SIGTERM on stop
            )  # fmt: skip

    def supervise(self, now: float) -> str | None:
        """Notice a crash or restart a crashed child; return a line to log, or ``None``.

        Raises ``StartFailed`` once the child failed right at start
        ``START_FAILURES_MAX`` times in a row (exited before it served, or
        ``refusal`` said it cannot start), naming the reason.
        """
        if self.restart_at is None:
            status = self.proc.poll()
            if status is None:
                if not self.served and self.serving is not None and self.serving():
                    self.served = True
                    self.start_failures = 0
                return None
            if self.served:
                self.start_failures = 0
            else:
                self._failed_at_start(f"{self.name} exited with status {status} before it served; last line of "
                                      f"{self.log_path}: {last_line(self.log_path)}")  # fmt: skip
            if now - self.started >= RESTART_RESET_S:
                self.delay_s = RESTART_FIRST_S  # it had been running fine: a fresh crash, not a loop
            self.restart_at = now + self.delay_s
            return (f"{self.name} exited with status {status}; restarting it in {self.delay_s:.0f} s "
                    f"(see {self.log_path})")  # fmt: skip
        if now < self.restart_at:
            return None
        refused = self.refusal() if self.refusal is not None else None
        if refused is not None:
            self._failed_at_start(f"{self.name} cannot start: {refused}")
            self.restart_at = now + self.delay_s
            self.delay_s = min(self.delay_s * 2, RESTART_MAX_S)
            return f"{self.name} cannot start: {refused}; trying again in {self.restart_at - now:.0f} s"
        self.served = self.serving is None
        self.proc = self._spawn()
        self.started = now
        self.restart_at = None
        self.restarts += 1
        self.delay_s = min(self.delay_s * 2, RESTART_MAX_S)
        return f"{self.name} restarted (pid {self.proc.pid}, restart {self.restarts})"

    def _failed_at_start(self, reason: str) -> None:
        self.start_failures += 1
        if self.start_failures >= START_FAILURES_MAX:
            raise StartFailed(f"{reason} ({self.start_failures} starts in a row failed; stopping everything)")


def _accepts(host: str, port: int) -> bool:
    """Return True if ``host:port`` accepts a TCP connection now (0.2 s at most)."""
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def celery_worker_command(python: str, *, name: str, queues: tuple[str, ...], concurrency: int) -> list[str]:
    """Return the command line of a Celery worker ``<name>@<host>`` consuming ``queues`` with ``concurrency`` processes.

    The one builder of ``./dev run``'s workers (``worker``: celery and bulk, 2
    processes; ``worker-live``: live, 1), so they differ only in what they consume.
    """
    return [
        python, "-m", "celery", "-A", "botmesh_admin", "worker", "-l", "INFO",
        "--concurrency", str(concurrency), "-n", f"{name}@%h", "-Q", ",".join(queues),
    ]  # fmt: skip


class Command(BaseCommand):
    help = "Run the admin (web + Celery workers + Celery beat) on the embedded default."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument(
            "--port",
            type=int,
            default=settings.CONFIG.port,
            help="port of the web server (default: BOTMESH_PORT, else 8000)",
        )
        parser.add_argument("--no-demo", action="store_true", help="do not load the demo tenant")
        parser.add_argument(
            "--reload-demo",
            action="store_true",
            help="load the demo data again even if an earlier start loaded it (overwrites your edits)",
        )
        parser.add_argument("--exit-after-load", action="store_true", help="stop once the demo is loaded (smoke test)")
        parser.add_argument(
            "--bot-replicas",
            type=int,
            default=BOT_REPLICAS,
            help=f"replica processes of the demo bot tienda-bot (default {BOT_REPLICAS}; 0: no bot)",
        )

    def handle(self, *args, **opts) -> None:  # type: ignore[no-untyped-def]
        base_url = f"http://{opts['host']}:{opts['port']}"
        if not 0 <= opts["bot_replicas"] <= BOT_MAX_REPLICAS:
            raise CommandError(f"--bot-replicas: must be 0..{BOT_MAX_REPLICAS}, not {opts['bot_replicas']}")
        fixtures = demo.fixtures_dir()
        if not opts["no_demo"] and not (fixtures / "ledger" / "messages.jsonl").is_file():
            raise CommandError(
                f"demo fixtures not found in {fixtures}: set BOTMESH_FIXTURES to the shared fixtures folder "
                "(../shared/fixtures next to this repository), or start with --no-demo"
            )
        # A port outside 1..65535 would pass argparse and fail deep in runserver (OverflowError) after the
        # workers had started and written into var/logs: refuse it before anything starts.
        if not MIN_PORT <= opts["port"] <= MAX_PORT:
            raise CommandError(
                f"--port: must be {MIN_PORT}..{MAX_PORT}, not {opts['port']} (or set BOTMESH_PORT to such a port)"
            )
        self._lock = hold_run_lock(settings.BOTMESH_DATA_DIR)  # held (open) until this process exits
        refused = port_refusal(opts["host"], opts["port"])
        if refused is not None:
            raise CommandError(refused)
        self._reindex()
        py = sys.executable
        log_dir = settings.BOTMESH_DATA_DIR / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        commands = {
            "web": [py, "manage.py", "runserver", f"{opts['host']}:{opts['port']}", "--noreload"],
            "worker": celery_worker_command(py, name="worker", queues=("celery", "bulk"), concurrency=2),
            # Live messages (inbound webhooks, replies) have a worker of their own, so a campaign, an
            # import or a ledger push never holds the processes a customer's message waits for.
            "worker-live": celery_worker_command(py, name="live", queues=("live",), concurrency=1),
            "beat": [py, "-m", "celery", "-A", "botmesh_admin", "beat", "-l", "INFO"],
        }
        env = dict(os.environ, PYTHONUNBUFFERED="1")  # live log files
        web_checks = {
            "serving": lambda: _accepts(opts["host"], opts["port"]),  # the port was free right before the spawn
            "refusal": lambda: port_refusal(opts["host"], opts["port"]),
        }
        children = {
            name: Child(name, cmd, log_dir / f"{name}.log", env, Path(settings.BASE_DIR),
                        **(web_checks if name == "web" else {}))  # type: ignore[arg-type]
            for name, cmd in commands.items()
        }  # fmt: skip

        stopping = False

        def stop(signum: int, frame: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        try:
            self._wait_ready(base_url, children)
            children["web"].served = True
            summaries: list[str] = []
            if not opts["no_demo"]:
                tokens = demo.ensure_accounts()
                earlier = demo.demo_loaded()
                if earlier and not opts["reload_demo"]:
                    summaries = [
                        "already loaded by an earlier start; your edits are kept (--reload-demo loads it again)"
                    ]
                else:
                    summaries = demo.load_over_http(base_url, tokens)
                    demo.mark_demo_loaded(summaries)
            for name, child in self._bots(base_url, opts["bot_replicas"], env, log_dir).items():
                children[name] = child
            bots = [f"{name} pid {child.proc.pid}" for name, child in children.items() if name.startswith("bot-")]
            lines = [
                "", self.style.SUCCESS(f"botmesh-admin is running at {base_url}/"),
                *(f"  {line}" for line in self._what_exists(base_url, demo_loaded=not opts["no_demo"])),
                *(f"  demo: {line}" for line in summaries),
                f"  web, worker and beat logs: {log_dir}/   Ctrl-C stops everything (or kill -INT {os.getpid()})",
                "  " + ", ".join(f"{name} pid {children[name].proc.pid}" for name in commands),
                *([f"  {demo.DEMO_BOT} replicas: {', '.join(bots)}  (kill -9 one, then open "
                   f"{base_url}/t/{demo.DEMO_TENANT}/replicas/)"] if bots else []),
            ]  # fmt: skip
            self.stdout.write("\n".join(lines))  # one write: whoever reads "is running at" reads the pids too
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

    def _bots(self, base_url: str, replicas: int, env: dict[str, str], log_dir: Path) -> dict[str, Child]:
        """Start the demo bot's replicas (none without the demo tenant or with ``--bot-replicas 0``)."""
        from botmesh_admin.tenancy import services
        from botmesh_admin.tenancy.models import ApiToken, Tenant

        if replicas == 0 or not Tenant.objects.filter(id=demo.DEMO_TENANT).exists():
            return {}
        for old in ApiToken.objects.filter(tenant_id=demo.DEMO_TENANT, name=BOT_TOKEN_NAME, revoked_at=None):
            services.token_revoke(demo.DEMO_TENANT, token_id=old.id)
        _, token = services.token_create(
            demo.DEMO_TENANT, name=BOT_TOKEN_NAME, role="bot", bot=demo.DEMO_BOT, created_by="botmesh_run"
        )
        url = settings.BOTMESH_COORDINATION_URL
        if url == "kv:":  # the bot has no Django: it opens the admin's Kv itself
            url = f"kv:{settings.BOTMESH_KV_URL}"
        # Secrets never on the command line, where ps shows them: the token and both URLs (a PostgreSQL Kv's or
        # a Redis coordinator's holds user:password@) go in the environment; a Redis coordinator keeps its fences'
        # mark in the Kv.
        bot_env = dict(
            env, BOTMESH_BOT_TOKEN=token, BOTMESH_COORDINATION_URL=str(url), BOTMESH_KV_URL=str(settings.BOTMESH_KV_URL)
        )
        argv = [sys.executable, "-m", "botmesh_admin.botclient.demo_bot", "--admin-url", base_url,
                "--tenant", demo.DEMO_TENANT, "--bot", demo.DEMO_BOT]  # fmt: skip
        return {
            f"bot-{n}": Child(
                f"bot-{n}",
                [*argv, "--replica-id", f"{demo.DEMO_BOT}-{n}"],
                log_dir / f"bot-{n}.log",
                bot_env,
                Path(settings.BASE_DIR),
            )  # fmt: skip
            for n in range(1, replicas + 1)
        }

    def _reindex(self) -> None:
        """Build the Kv indexes an installation from an earlier version lacks (with progress)."""
        from .botmesh_reindex import tenant_ids, unbuilt

        call_command(
            "botmesh_upgrade", stdout=self.stdout, verbosity=0
        )  # kernel tables of earlier versions (idempotent)
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

    def _what_exists(self, base_url: str, *, demo_loaded: bool) -> list[str]:
        """The login and links to print: the demo's where they exist, else how to add them.

        ``--no-demo`` loads no demo, so then only the how.
        """
        from django.contrib.auth import get_user_model

        from botmesh_admin.tenancy.models import Tenant

        users = get_user_model().objects
        # With --no-demo a demo password an earlier start set may have been changed since: checked, not assumed.
        logins = [
            f"{name} / {password} ({role})"
            for name, password, role in ((demo.ADMIN_USER, demo.ADMIN_PASSWORD, "admin"),
                                         (demo.AGENT_USER, demo.AGENT_PASSWORD, "agent"))
            if demo_loaded or any(u.check_password(password) for u in users.filter(username=name))
        ]  # fmt: skip
        lines = []
        if logins:
            lines.append("log in as " + " or ".join(logins))
        elif users.exists():
            lines.append(f"log in at {base_url}/login/ with your account")
        else:
            lines.append("no user yet: python manage.py createsuperuser, then "
                         "python manage.py botmesh_tenant create <id> --name <name> --admin <user>")  # fmt: skip
        if Tenant.objects.filter(id=demo.DEMO_TENANT).exists():
            lines.append(f"demo tenant: {base_url}/t/{demo.DEMO_TENANT}/   API docs: {base_url}/api/v1/docs")
        else:
            lines.append(f"API docs: {base_url}/api/v1/docs")
        return lines

    def _wait_ready(self, base_url: str, children: dict[str, Child]) -> None:
        deadline = time.monotonic() + 90
        last = ""
        while time.monotonic() < deadline:
            for name, child in children.items():
                if child.proc.poll() is not None:
                    raise CommandError(f"{name} exited with status {child.proc.returncode} during start-up; "
                                       f"last line of {child.log_path}: {last_line(child.log_path)}")  # fmt: skip
            try:
                with urllib.request.urlopen(f"{base_url}/readyz", timeout=5) as resp:
                    if resp.status == 200 and children["web"].proc.poll() is None:
                        return
            except urllib.error.HTTPError as exc:
                last = json.loads(exc.read() or b"{}").get("reason", "")
            except OSError as exc:
                last = str(exc)
            time.sleep(0.5)
        raise CommandError(f"web did not become ready: {last}")

    def _stop(self, procs: dict[str, subprocess.Popen[bytes]]) -> None:
        self.stdout.write(f"stopping {', '.join(procs)} …")
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
