"""Journal throughput: append + claim + ack per second, against procrastinate on the same PostgreSQL.

Run ``.venv/bin/python bench/journal.py [--events 2000] [--rounds 2]`` after
``eval "$(scripts/services.sh)"``; it reads ``BOTMESH_TEST_POSTGRES_URL`` and
``BOTMESH_TEST_REDIS_URL`` (a system whose server is missing is skipped).

The workload, identical for every system: W worker processes (W = 1 and 4)
first each append ``events / W`` small events one by one, then each drains the
queue — claim one, run a no-op handler, ack — until it is empty. The clock runs
from the moment every worker is ready to the moment the last one finds the queue
empty; the figure is events / second (each event = one append + claim + ack).

The batched row runs the same workload through the batched journal (issue 21,
item 1): ``append_many`` of 500 events, then ``EventWorker`` claiming 100 at a
time (``claim_many``), running the handler on each and settling the batch with
one ``ack_many``. Its ratio is printed against procrastinate when installed and
always against the one-at-a-time journal of the same run.

The peer baseline is procrastinate, not a project dependency: install it into
a virtualenv of its own so the project's ``.venv`` stays as ``pyproject.toml``
pins it, and run the bench with that one::

    python3 -m venv .benchvenv
    .benchvenv/bin/pip install -q -e ".[test]" procrastinate
    .benchvenv/bin/python bench/journal.py

(procrastinate 3.10.0 installs beside our pins with no conflict; it adds
croniter and psycopg-pool.) Its workload: ``task.defer()`` per job (its sync
path over the async ``PsycopgConnector``), then
``app.run_worker(wait=False, concurrency=1, listen_notify=False)`` per process,
in its own schema on the same PostgreSQL database, with the same server
settings (fsync on commit). Without it the journal rows still print, with no
ratio against it.
Targets with one worker: the PostgreSQL journal ≥ 1.0× procrastinate, the
batched PostgreSQL journal ≥ 10× procrastinate.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET_RATIO = 1.0
BATCHED_TARGET_RATIO = 10.0
APPEND_BATCH = 500
CLAIM_BATCH = 100
PROCRASTINATE_SCHEMA = "botmesh_bench_procrastinate"
# procrastinate warns that its App lives in __main__ (a bench script's choice); keep output clean.
logging.getLogger("procrastinate").setLevel(logging.ERROR)


# -- the botmesh journal ---------------------------------------------------------------


def journal_worker(url: str, share: int, worker: int, ready: mp.Barrier, go: mp.Barrier) -> None:
    """One at a time: ``append`` per event, then claim one, handle, ack (the journal before batching)."""
    from botmesh_admin.events import Envelope, connect_journal
    from botmesh_admin.events.worker import EventWorker

    journal = connect_journal(url)
    journal.ping()
    ready.wait()
    go.wait()
    for n in range(share):
        journal.append(Envelope(type="bench.event", tenant="bench", payload={"n": n}, idempotency_key=f"{worker}-{n}"))
    drainer = EventWorker(journal, lease_ms=30_000, claim_batch=1)
    while any(drainer.run_batch(lambda record: None, 100).values()):
        pass
    journal.close()


def journal_worker_batched(url: str, share: int, worker: int, ready: mp.Barrier, go: mp.Barrier) -> None:
    """Batched: ``append_many`` of ``APPEND_BATCH``, ``claim_many`` of ``CLAIM_BATCH``, handled, one ``ack_many``."""
    from botmesh_admin.events import Envelope, connect_journal
    from botmesh_admin.events.worker import EventWorker

    journal = connect_journal(url)
    journal.ping()
    ready.wait()
    go.wait()
    for start in range(0, share, APPEND_BATCH):
        journal.append_many(
            [
                Envelope(type="bench.event", tenant="bench", payload={"n": n}, idempotency_key=f"{worker}-{n}")
                for n in range(start, min(start + APPEND_BATCH, share))
            ]
        )
    drainer = EventWorker(journal, lease_ms=30_000, claim_batch=CLAIM_BATCH)
    while any(drainer.run_batch(lambda record: None, 1000).values()):
        pass
    journal.close()


def drop_journal(url: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.events.journals import drop

    drop(url)


# -- procrastinate -----------------------------------------------------------------------


def _procrastinate_app(conninfo: str):  # type: ignore[no-untyped-def]
    import procrastinate

    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(
            conninfo=conninfo, kwargs={"options": f"-c search_path={PROCRASTINATE_SCHEMA}"}
        )
    )

    @app.task(queue="bench", name="bench.noop")
    def noop(n: int) -> None:
        return None

    return app, noop


def procrastinate_worker(conninfo: str, share: int, worker: int, ready: mp.Barrier, go: mp.Barrier) -> None:
    app, noop = _procrastinate_app(conninfo)
    with app.open():
        app.check_connection()
        ready.wait()
        go.wait()
        for n in range(share):
            noop.defer(n=n)
    app.run_worker(
        queues=["bench"], wait=False, concurrency=1, listen_notify=False,
        install_signal_handlers=False, name=f"bench-{worker}",
    )  # fmt: skip


def reset_procrastinate(conninfo: str) -> None:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {PROCRASTINATE_SCHEMA} CASCADE")
        conn.execute(f"CREATE SCHEMA {PROCRASTINATE_SCHEMA}")
    app, _ = _procrastinate_app(conninfo)
    with app.open():
        app.schema_manager.apply_schema()


def drop_procrastinate(conninfo: str) -> None:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {PROCRASTINATE_SCHEMA} CASCADE")


# -- the harness ---------------------------------------------------------------------------


def run(target: Callable[..., None], arg: str, events: int, workers: int) -> float:
    """Run ``workers`` processes of ``target``; return events per second."""
    ctx = mp.get_context("fork")
    ready, go = ctx.Barrier(workers + 1), ctx.Barrier(workers + 1)
    share = events // workers
    procs = [ctx.Process(target=target, args=(arg, share, w, ready, go)) for w in range(workers)]
    for proc in procs:
        proc.start()
    ready.wait(timeout=60)
    start = time.perf_counter()
    go.wait(timeout=60)
    for proc in procs:
        proc.join(timeout=600)
        if proc.exitcode != 0:
            raise SystemExit(f"a {target.__name__} process failed (exit {proc.exitcode})")
    return share * workers / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2, help="median of this many runs per cell")
    parser.add_argument("--workers", default="1,4")
    args = parser.parse_args()
    worker_counts = [int(w) for w in args.workers.split(",")]
    pg = os.environ.get("BOTMESH_TEST_POSTGRES_URL")
    redis_url = os.environ.get("BOTMESH_TEST_REDIS_URL")
    try:
        import procrastinate  # noqa: F401

        have_procrastinate = True
    except ImportError:
        have_procrastinate = False
        print(
            "procrastinate is not installed: for the peer baseline run this with a virtualenv of its own"
            ' (python3 -m venv .benchvenv && .benchvenv/bin/pip install -e ".[test]" procrastinate)'
        )
    if not pg:
        print('BOTMESH_TEST_POSTGRES_URL is not set: PostgreSQL skipped (eval "$(scripts/services.sh)")')
    if not redis_url:
        print("BOTMESH_TEST_REDIS_URL is not set: Redis skipped")

    def median(make_url: Callable[[], str], target: Callable[..., None], workers: int) -> float:
        rates = []
        for _ in range(args.rounds):
            url = make_url()
            try:
                rates.append(run(target, url, args.events, workers))
            finally:
                drop_journal(url) if target is not procrastinate_worker else None
        return statistics.median(rates)

    def journal_url(base: str) -> Callable[[], str]:
        def make() -> str:
            url = f"{base}{'&' if '?' in base else '?'}namespace=bench_{uuid.uuid4().hex[:8]}"
            from botmesh_admin.events import connect_journal

            connect_journal(url).close()  # create the schema outside the timed part
            return url

        return make

    def procrastinate_url() -> str:
        reset_procrastinate(pg)  # type: ignore[arg-type]
        return pg  # type: ignore[return-value]

    print(f"{args.events} events, append + claim + ack, median of {args.rounds} runs (events/s)")
    for workers in worker_counts:
        baseline = None
        if pg and have_procrastinate:
            baseline = median(procrastinate_url, procrastinate_worker, workers)
            drop_procrastinate(pg)
            print(f"  {workers} worker(s)  procrastinate {procrastinate.__version__:<8} {baseline:8.0f}/s  (baseline)")
        for name, base in (("postgresql", pg), ("redis", redis_url)):
            if not base:
                continue
            value = median(journal_url(base), journal_worker, workers)
            ratio = f"{value / baseline:5.2f}x procrastinate" if baseline else "(no procrastinate baseline)"
            verdict = ""
            if name == "postgresql" and workers == 1 and baseline:
                verdict = "  target >= 1.0x: " + ("met" if value / baseline >= TARGET_RATIO else "MISSED")
            print(f"  {workers} worker(s)  journal {name:<20} {value:8.0f}/s  {ratio}{verdict}")
            batched = median(journal_url(base), journal_worker_batched, workers)
            ratios = [f"{batched / value:5.2f}x the one-at-a-time journal"]
            verdict = ""
            if baseline:
                ratios.insert(0, f"{batched / baseline:5.2f}x procrastinate")
                if name == "postgresql" and workers == 1:
                    met = batched / baseline >= BATCHED_TARGET_RATIO
                    verdict = f"  target >= {BATCHED_TARGET_RATIO:.0f}x: " + ("met" if met else "MISSED")
            print(
                f"  {workers} worker(s)  journal {name + ' batched':<20} {batched:8.0f}/s  {', '.join(ratios)}{verdict}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
