"""Inbox ingest: signed webhook POST → journal → worker → projected message, on PostgreSQL.

Run ``.venv/bin/python bench/ingest.py [--messages 2000] [--senders 4] [--workers 4] [--rounds 3]``
after ``eval "$(scripts/services.sh)"`` (reads ``BOTMESH_TEST_POSTGRES_URL``).

Setup: a fresh database ``botmesh_bench_inbox_<pid>`` on that server (dropped at the end, so two
runs at once on one server do not drop each other's) holds the Django
tables, the Kv and the event journal. The real Django app is served by Django's
threaded WSGI server in this process; ``--senders`` threads POST WhatsApp Cloud
API webhook bodies (one text message each, 200 senders, HMAC-signed with the
channel's app secret) to ``/webhooks/whatsapp/<tenant>``; ``--workers`` threads
run the journal's ``EventWorker`` on the ``inbound`` channel, which projects each
message into the inbox (and upserts its CRM contact).

Measured: messages per second from the first POST until the last message is
projected (every message is then checked in the inbox), and the p50/p99 of the
webhook's answer time. Baseline (issue 21), in the same run: the requests per
second of an empty Django request (``GET /healthz``) on the same gunicorn with
the same client — the web tier's ceiling, which no webhook can pass, since each
webhook is such a request plus its signature check, journal write and projection.
``--rounds`` alternates the two (new messages each round) and keeps the best of
each, so a burst of load from other processes on the machine hits both sides
alike; each round's own ratio is printed too. Target: ours ≥ 0.3 × the ceiling.

Also reported: the same rows written by ``--senders`` threads with one psycopg
``INSERT`` per message (autocommit; the first target's baseline, which no Django
webhook can approach), and CPU milliseconds per message of each process group
(the senders, gunicorn, the workers, PostgreSQL's backends serving this run's
database — other databases' backends on a shared server are not counted —, Redis).

``--no-index-upkeep`` runs the web and the workers with every store writing
only its own records (``bench/no_index_upkeep/sitecustomize.py``): runs with
and without it give the index upkeep's share of ingest (issue 16, item 7:
at most 10 %). Two runs differ by more than that share on this machine, so
``--upkeep-share`` measures it inside one run instead: the same web and worker
processes serve two tenants, ``bench-inbox`` with every index kept and
``bench-raw`` whose tables skip the upkeep (``BOTMESH_BENCH_NO_UPKEEP_TENANT``),
and ``--rounds`` rounds per side alternate (``idx``, ``raw``, ``raw``, ``idx``,
…) after a warm-up of each. Printed per side: the median of the rounds' CPU
per message of each process group, of the server side (web, workers,
PostgreSQL, Redis) and of msg/s; the upkeep's share of ingest is
``idx / raw − 1`` of the server side's CPU per message (target ≤ 10 %), and
of the time per message.

The worker processes poll the journal every ``--idle-ms`` (20) when it is empty
(production's ``botmesh_events_worker`` waits 500 ms; Celery drain tasks wake it
sooner): each poll is a claim statement, and four processes polling every 5 ms
used a sixth of this 2-core machine while the web was the bottleneck.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
TARGET_RATIO = 0.3  # of the empty-Django-request ceiling (issue 21)
DATABASE = f"botmesh_bench_inbox_{os.getpid()}"
APP_SECRET = "bench-app-secret"
PHONE_NUMBER_ID = "106540352242922"
TENANT = "bench-inbox"
RAW_TENANT = "bench-raw"  # --upkeep-share: its tables skip the index upkeep
UPKEEP_TARGET = 0.10  # index upkeep's share of ingest, at most (issue 16, item 7)


def database_url(server_url: str, name: str) -> str:
    parts = urlsplit(server_url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


def fresh_database(server_url: str) -> str:
    """(Re)create the bench database; return its URL."""
    import psycopg

    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DATABASE}"')
    return database_url(server_url, DATABASE)


def drop_database(server_url: str) -> None:
    """Drop the bench database (its connections too)."""
    import psycopg

    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')


def bench_env(url: str) -> dict[str, str]:
    """Return the environment of every process: PostgreSQL for the database, Kv and journal.

    Counters go to Redis (``REDIS_URL``) as in production, when a test Redis is available.
    """
    env = {
        "DJANGO_SETTINGS_MODULE": "botmesh_admin.settings",
        "DATABASE_URL": url,
        "BOTMESH_KV_URL": url,
        "BOTMESH_JOURNAL_URL": url,
        "CELERY_BROKER_URL": "memory://",
        "DEBUG": "0",
        "BOTMESH_DATA_DIR": os.environ.get("BOTMESH_BENCH_DIR") or tempfile.mkdtemp(prefix="bench-ingest-"),
    }
    if os.environ.get("BOTMESH_TEST_REDIS_URL"):
        env["REDIS_URL"] = os.environ["BOTMESH_TEST_REDIS_URL"]
    return env


def django_setup(url: str) -> None:
    os.environ.update(bench_env(url))
    os.environ["BOTMESH_BENCH_DIR"] = os.environ["BOTMESH_DATA_DIR"]
    import django

    django.setup()
    import logging

    logging.disable(logging.WARNING)  # per-message INFO lines would dominate the profile


def setup_django(url: str, tenants: tuple[str, ...] = (TENANT,)) -> None:
    django_setup(url)
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    from botmesh_admin.channels.services import channel_config_set
    from botmesh_admin.tenancy.services import tenant_create

    for tenant in tenants:
        tenant_create(tenant, name="Bench")
        channel_config_set(
            tenant, kind="whatsapp", name="main", phone_number_id=PHONE_NUMBER_ID, app_secret=APP_SECRET
        )  # fmt: skip


def bodies(n: int, run: str) -> list[tuple[str, bytes, str]]:
    """Return ``(wamid, raw body, signature)`` of ``n`` one-message webhooks."""
    from botmesh_admin.channels import whatsapp

    out = []
    base_ts = int(time.time()) - 3600
    for i in range(n):
        sender = f"57300{i % 200:07d}"
        wamid = f"wamid.bench{run}{i:08d}"
        body = {
            "object": "whatsapp_business_account",
            "entry": [
                {
                    "id": "1",
                    "changes": [
                        {
                            "field": "messages",
                            "value": {
                                "messaging_product": "whatsapp",
                                "metadata": {"display_phone_number": "15550783881", "phone_number_id": PHONE_NUMBER_ID},
                                "contacts": [{"profile": {"name": f"Cliente {i % 200}"}, "wa_id": sender}],
                                "messages": [
                                    {
                                        "from": sender,
                                        "id": wamid,
                                        "timestamp": str(base_ts + i),
                                        "type": "text",
                                        "text": {"body": f"mensaje {i}"},
                                    }
                                ],
                            },
                        }
                    ],
                }
            ],
        }
        raw = json.dumps(body, separators=(",", ":")).encode()
        out.append((wamid, raw, whatsapp.signature(raw, APP_SECRET)))
    return out


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve(web_processes: int, threads: int = 4) -> tuple[str, subprocess.Popen]:
    """Start gunicorn (``web_processes`` × ``threads``) on the real WSGI app; return its URL."""
    port = free_port()
    web = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "botmesh_admin.wsgi",
            "-b",
            f"127.0.0.1:{port}",
            "-w",
            str(web_processes),
            "--threads",
            str(threads),
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env={**os.environ},
        stdout=subprocess.DEVNULL,
    )
    # Booting two workers took 22 s on the shared 2-core machine at load 15, and more than
    # 30 s at load 20: wait long enough that a busy machine slows the run instead of failing it.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                return f"http://127.0.0.1:{port}", web
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(0.2)
    web.terminate()
    raise RuntimeError("gunicorn did not start")


def start_workers(workers: int, idle_ms: int) -> list[subprocess.Popen]:
    """Start ``workers`` processes draining the ``inbound`` journal channel (what Celery workers do)."""
    return [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", "--idle-ms", str(idle_ms)], cwd=ROOT, env={**os.environ}
        )
        for _ in range(workers)
    ]


def worker_main(idle_ms: int) -> int:
    """Drain the inbound channel until SIGTERM, polling every ``idle_ms`` while it is empty."""
    import signal

    django_setup(os.environ["DATABASE_URL"])
    from botmesh_admin.events import default_journal
    from botmesh_admin.events.handlers import dispatch
    from botmesh_admin.events.worker import EventWorker

    worker = EventWorker(default_journal(), lease_ms=30_000, channel="inbound")
    signal.signal(signal.SIGTERM, lambda *_: worker.stop())
    worker.run_forever(dispatch, batch=50, idle_ms=idle_ms)
    return 0


def post_all(base: str, items: list[tuple[str, bytes, str]], senders: int, tenant: str = TENANT) -> list[float]:
    """POST every body with ``senders`` threads, each on one keep-alive connection; return the answer times in ms.

    Meta's and Telegram's senders reuse their connections too; a new TCP
    connection per POST cost the client and the server a third of a millisecond each.
    """
    host, port = urlsplit(base).hostname, urlsplit(base).port
    times: list[float] = []
    lock = threading.Lock()
    chunks = [items[i::senders] for i in range(senders)]

    def send(chunk: list[tuple[str, bytes, str]]) -> None:
        mine = []
        conn = http.client.HTTPConnection(host, port, timeout=30)
        for _, raw, signature in chunk:
            headers = {"Content-Type": "application/json", "X-Hub-Signature-256": signature}
            start = time.perf_counter()
            for attempt in (1, 2):  # the server may close an idle keep-alive connection: reconnect once
                try:
                    conn.request("POST", f"/webhooks/whatsapp/{tenant}", body=raw, headers=headers)
                    response = conn.getresponse()
                    response.read()
                    break
                except (http.client.RemoteDisconnected, ConnectionError):
                    conn.close()
                    if attempt == 2:
                        raise
            assert response.status == 200, response.status
            mine.append((time.perf_counter() - start) * 1000)
        conn.close()
        with lock:
            times.extend(mine)

    threads = [threading.Thread(target=send, args=(c,)) for c in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return times


def empty_requests(base: str, n: int, senders: int) -> float:
    """Return requests per second of ``GET /healthz`` (an empty Django request) on the same server and client.

    The ceiling of any webhook on this web tier: every webhook is at least one
    such request, before it checks a signature, writes the journal or projects.
    """
    host, port = urlsplit(base).hostname, urlsplit(base).port

    def get(count: int) -> None:
        conn = http.client.HTTPConnection(host, port, timeout=30)
        for _ in range(count):
            conn.request("GET", "/healthz")
            response = conn.getresponse()
            response.read()
            assert response.status == 200, response.status
        conn.close()

    start = time.perf_counter()
    threads = [threading.Thread(target=get, args=(n // senders,)) for _ in range(senders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return (n // senders) * senders / (time.perf_counter() - start)


def wait_projected(expected: int, timeout_s: float, tenant: str = TENANT) -> float:
    """Wait until the journal holds no pending/leased inbound record of ``tenant``; return when."""
    from botmesh_admin.events import default_journal

    journal = default_journal()
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        counts = journal.counts(tenant)
        open_records = sum(n for (state, channel), n in counts.items() if state in ("pending", "leased"))
        if open_records == 0 and counts.get(("done", "inbound"), 0) >= expected:
            return time.perf_counter()
        time.sleep(0.05)  # each poll is a count over the tenant's records: keep it off the profile
    raise TimeoutError(f"not projected within {timeout_s} s: {journal.counts(tenant)}")


def check_projected(items: list[tuple[str, bytes, str]], tenant: str = TENANT) -> None:
    from inbox.stores import default_store

    store = default_store()
    missing = [wamid for wamid, _, _ in items if store.message_get(tenant, wamid) is None]
    if missing:
        raise AssertionError(f"{len(missing)} messages not projected, e.g. {missing[:3]}")


def baseline(url: str, items: list[tuple[str, bytes, str]], senders: int) -> float:
    """Return rows per second: one psycopg INSERT per message, ``senders`` threads, autocommit."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_raw_messages")
        conn.execute(
            "CREATE TABLE bench_raw_messages (id text PRIMARY KEY, tenant text NOT NULL, "
            "chat_key text NOT NULL, body jsonb NOT NULL, timestamp_ms bigint NOT NULL)"
        )
    rows = []
    for wamid, raw, _ in items:
        message = json.loads(raw)["entry"][0]["changes"][0]["value"]["messages"][0]
        rows.append(
            (wamid, TENANT, f"whatsapp:{message['from']}", json.dumps(message), int(message["timestamp"]) * 1000)
        )
    chunks = [rows[i::senders] for i in range(senders)]

    def insert(chunk: list[tuple]) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            for row in chunk:
                conn.execute("INSERT INTO bench_raw_messages VALUES (%s, %s, %s, %s, %s)", row)

    start = time.perf_counter()
    threads = [threading.Thread(target=insert, args=(c,)) for c in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(rows) / (time.perf_counter() - start)


def cpu_by_pid(pids: list[int]) -> dict[int, float]:
    """Return the CPU time (user + system, seconds) used so far by each live pid of ``pids`` (Linux ``/proc``)."""
    out: dict[int, float] = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone
        out[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime (ticks)
    return out


def cpu_used(before: dict[int, float], after: dict[int, float]) -> float:
    """Return the CPU seconds a group used between two ``cpu_by_pid`` samples; never negative.

    A pid is counted by its own growth (from 0 when it started in between). A pid
    that ended in between is left out — its last CPU is unknown — where summing each
    sample's live pids subtracted a whole process's lifetime CPU (the negative
    PostgreSQL figures: other runs' backends on the shared server ended mid-round).
    """
    return sum(max(0.0, cpu - before.get(pid, 0.0)) for pid, cpu in after.items())


_sampler: dict[str, Any] = {}


def database_backends(url: str) -> list[int]:
    """Return the pids of PostgreSQL's backends connected to the database of ``url`` (this run's).

    Asked on one connection kept for the run: a new one per sample failed the whole run
    when the shared server had no connection slot left at that moment.
    """
    import psycopg

    if url not in _sampler:
        _sampler[url] = psycopg.connect(url, autocommit=True)
    rows = (
        _sampler[url]
        .execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
        .fetchall()
    )
    return [int(pid) for (pid,) in rows]


def process_groups(url: str, web: subprocess.Popen, workers: list[subprocess.Popen]) -> dict[str, list[int]]:
    """Return the pids to account CPU to: this process (the senders), web, workers, this database's backends, Redis."""

    def children(pid: int) -> list[int]:
        try:
            return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except OSError:
            return []

    def redis_servers() -> list[int]:
        """The ``redis-server`` serving ``REDIS_URL`` (by its port), not the other servers of the machine."""
        if not os.environ.get("REDIS_URL"):
            return []
        port = f":{urlsplit(os.environ['REDIS_URL']).port or 6379}"
        out = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                    if (entry / "comm").read_text().strip() == "redis-server" and port in cmdline:
                        out.append(int(entry.name))
                except OSError:
                    pass
        return out

    return {
        "senders (bench)": [os.getpid()],
        "web": [web.pid, *children(web.pid)],
        "workers": [w.pid for w in workers],
        "postgres": database_backends(url),
        "redis": redis_servers(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--web", type=int, default=2, help="gunicorn processes")
    parser.add_argument("--threads", type=int, default=4, help="threads per gunicorn process")
    parser.add_argument("--idle-ms", type=int, default=20, help="worker poll interval when idle, ms")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the best of each side counts")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument(
        "--no-index-upkeep",
        action="store_true",
        help="web and workers write without the kernel's index upkeep (bench/no_index_upkeep): issue 16's 'before'",
    )
    parser.add_argument(
        "--upkeep-share",
        action="store_true",
        help=f"alternate rounds between {TENANT} (every index) and {RAW_TENANT} (no upkeep) on the same processes",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.upkeep_share and args.no_index_upkeep:
        parser.error("--upkeep-share already runs one tenant without the upkeep; leave out --no-index-upkeep")
    if args.upkeep_share:
        os.environ["BOTMESH_BENCH_NO_UPKEEP_TENANT"] = RAW_TENANT
    if args.no_index_upkeep or args.upkeep_share:  # inherited by gunicorn and the workers (their sitecustomize)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT / "bench" / "no_index_upkeep"), os.environ.get("PYTHONPATH")) if p
        )
    if args.worker:
        return worker_main(args.idle_ms)
    server_url = os.environ.get("BOTMESH_TEST_POSTGRES_URL")
    if not server_url:
        print('BOTMESH_TEST_POSTGRES_URL is not set: run `eval "$(scripts/services.sh)"` first')
        return 2
    url = fresh_database(server_url)
    try:
        setup_django(url, (TENANT, RAW_TENANT) if args.upkeep_share else (TENANT,))
        base, web = serve(args.web, args.threads)
        workers = start_workers(args.workers, args.idle_ms)
        try:
            run = measure_share if args.upkeep_share else measure
            return run(args, url, base, lambda: process_groups(url, web, workers))
        finally:
            for process in (web, *workers):
                process.terminate()
            for process in (web, *workers):
                process.wait(timeout=30)
    finally:
        from django.db import connections

        connections.close_all()
        for conn in _sampler.values():
            conn.close()
        drop_database(server_url)


def measure(args: argparse.Namespace, url: str, base: str, groups_now: Callable[[], dict[str, list[int]]]) -> int:
    """Run ``--rounds`` alternating rounds of our ingest and the baselines; print the report; 0 if on target."""
    warm = bodies(50, "warm")
    post_all(base, warm, args.senders)
    wait_projected(len(warm), args.timeout)
    empty_requests(base, 200, args.senders)
    done = len(warm)
    rounds: list[
        tuple[float, list[float], float, float, dict[str, float]]
    ] = []  # (msg/s, answer ms, posted s, projected s, CPU ms/msg)
    raws: list[float] = []
    empties: list[float] = []
    for n in range(max(1, args.rounds)):
        items = bodies(args.messages, f"run{n}")
        groups = groups_now()  # after the warm-up: the database connections (backends) exist
        cpu_before = {name: cpu_by_pid(pids) for name, pids in groups.items()}
        start = time.perf_counter()
        answer_ms = post_all(base, items, args.senders)
        posted = time.perf_counter()
        done += len(items)
        end = wait_projected(done, args.timeout)
        after = groups_now()  # a backend or process started during the round counts from 0
        cpu = {
            name: cpu_used(cpu_before[name], cpu_by_pid(sorted(set(pids) | set(after.get(name, [])))))
            * 1000
            / len(items)
            for name, pids in groups.items()
        }
        check_projected(items)
        rounds.append((len(items) / (end - start), sorted(answer_ms), posted - start, end - start, cpu))
        empties.append(empty_requests(base, args.messages, args.senders))
        raws.append(baseline(url, items, args.senders))
        print(
            f"  round {n + 1}: webhook → projected {rounds[-1][0]:6.0f} msg/s, empty Django request "
            f"{empties[-1]:6.0f} req/s ({rounds[-1][0] / empties[-1]:.3f}x), raw INSERT {raws[-1]:6.0f} msg/s"
        )

    ours, answer_ms, posted_s, projected_s, cpu = max(rounds, key=lambda r: r[0])
    raw = max(raws)
    empty = max(empties)
    p50 = statistics.median(answer_ms)
    p99 = answer_ms[min(len(answer_ms) - 1, int(len(answer_ms) * 0.99))]
    ratio = ours / empty
    print(
        f"inbox ingest on PostgreSQL: {args.messages} messages per round, {args.senders} senders, "
        f"{args.web}x{args.threads} web threads, {args.workers} worker processes, best of {len(rounds)} rounds"
    )
    print(
        f"  webhook → projected   {ours:8.0f} msg/s   (all POSTs answered after {posted_s:.2f} s, "
        f"all projected after {projected_s:.2f} s)"
    )
    print(f"  empty Django request  {empty:8.0f} req/s   (GET /healthz on the same gunicorn and client: the ceiling)")
    print(
        f"  ratio                 {ratio:8.3f}x   of the ceiling (target >= {TARGET_RATIO}x) "
        f"{'OK' if ratio >= TARGET_RATIO else 'BELOW TARGET'}"
    )
    print(f"  raw INSERT            {raw:8.0f} msg/s   (ours {ours / raw:.3f}x; one psycopg INSERT per message)")
    print(f"  webhook answer        p50 {p50:.1f} ms   p99 {p99:.1f} ms   (best round)")
    print(
        "  CPU per message       "
        + ", ".join(f"{name} {ms:.2f} ms" for name, ms in cpu.items())
        + f"   (total {sum(cpu.values()):.2f} ms, best round)"
    )
    return 0 if ratio >= TARGET_RATIO else 1


def measure_share(args: argparse.Namespace, url: str, base: str, groups_now: Callable[[], dict[str, list[int]]]) -> int:
    """Alternate rounds between the indexed and the raw tenant; print the upkeep's share; 0 if within target."""
    done = {TENANT: 0, RAW_TENANT: 0}
    for tenant in done:  # each tenant's first contacts, conversations and index states
        warm = bodies(200, f"warm-{tenant}")
        post_all(base, warm, args.senders, tenant)
        done[tenant] += len(warm)
        wait_projected(done[tenant], args.timeout, tenant)
    sides: dict[str, list[tuple[float, dict[str, float]]]] = {TENANT: [], RAW_TENANT: []}  # (msg/s, CPU ms/msg)
    order = ([TENANT, RAW_TENANT, RAW_TENANT, TENANT] * args.rounds)[: 2 * max(1, args.rounds)]
    for n, tenant in enumerate(order):
        items = bodies(args.messages, f"run{n}-{tenant}")
        groups = groups_now()
        cpu_before = {name: cpu_by_pid(pids) for name, pids in groups.items()}
        start = time.perf_counter()
        post_all(base, items, args.senders, tenant)
        done[tenant] += len(items)
        end = wait_projected(done[tenant], args.timeout, tenant)
        after = groups_now()
        cpu = {
            name: cpu_used(cpu_before[name], cpu_by_pid(sorted(set(pids) | set(after.get(name, [])))))
            * 1000
            / len(items)
            for name, pids in groups.items()
        }
        check_projected(items, tenant)
        sides[tenant].append((len(items) / (end - start), cpu))
        server = sum(ms for name, ms in cpu.items() if name != "senders (bench)")
        label = "idx" if tenant == TENANT else "raw"
        rate = sides[tenant][-1][0]
        print(f"  round {n + 1} {label}: {rate:6.0f} msg/s, server CPU {server:5.2f} ms/msg", flush=True)

    def median_of(tenant: str, name: str | None) -> float:
        if name is None:  # the server side: every group but the bench's own client
            return statistics.median(
                sum(ms for group, ms in cpu.items() if group != "senders (bench)") for _, cpu in sides[tenant]
            )
        return statistics.median(cpu[name] for _, cpu in sides[tenant])

    print(
        f"index upkeep's share of inbox ingest on PostgreSQL: {len(order) // 2} rounds of {args.messages} messages "
        f"per side, alternated on the same {args.web}x{args.threads} web threads and {args.workers} workers; medians"
    )
    names = [name for name in sides[TENANT][0][1] if name != "senders (bench)"]
    for name in [*names, None]:
        idx, raw = median_of(TENANT, name), median_of(RAW_TENANT, name)
        share = idx / raw - 1 if raw else 0.0
        label = name or "server side"
        print(f"  CPU/msg {label:12} with indexes {idx:5.2f} ms   without {raw:5.2f} ms   {share:+6.1%}")
    idx_rate = statistics.median(rate for rate, _ in sides[TENANT])
    raw_rate = statistics.median(rate for rate, _ in sides[RAW_TENANT])
    time_share = raw_rate / idx_rate - 1
    print(
        f"  msg/s                with indexes {idx_rate:5.0f}      without {raw_rate:5.0f}      "
        f"time/msg {time_share:+6.1%}"
    )
    share = median_of(TENANT, None) / median_of(RAW_TENANT, None) - 1
    verdict = "OK" if share <= UPKEEP_TARGET else "ABOVE TARGET"
    print(f"  upkeep's share of ingest (server CPU per message) {share:+.1%} (target <= {UPKEEP_TARGET:.0%}) {verdict}")
    return 0 if share <= UPKEEP_TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
