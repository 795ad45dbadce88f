"""The job API of one occurrence run: fenced effects and ``still_holds()`` (ARCHITECTURE §9).

The runner (``services.job_occurrence_run``) makes an ``OccurrenceContext`` for
the claim it holds on an occurrence in the ledger (the journal record and its
fencing token); the task it runs gets it from ``current_occurrence()``.

A lease alone does not stop a holder frozen past its expiry (SIGSTOP, a GC
pause, a stalled disk): it resumes believing it holds the occurrence after
another worker took it over, and would redo its effects. So:

- ``still_holds()`` asks the ledger whether this claim is still the
  occurrence's live lease (the same fencing token, leased, not expired). The
  runner asks before every fenced commit and once more after the task
  returned; a task asks before any side effect it cannot commit through the
  Kv (a send, a sweep batch). ``check()`` raises ``Superseded`` instead.
- ``commit(table, ops, step=…)`` applies ``ops`` in **one atomic Kv commit**
  together with two guard entries of the same table (a Kv commit is atomic
  inside one table only, so the guard lives next to the effects, as
  ``FenceGuard``'s does):

  * ``~occurrence/<occurrence id>`` holds the highest fencing token that
    committed effects of this occurrence into the table; the commit
    compare-and-sets it, and a run whose token is older than one that
    already committed here is refused, whatever its clock believes
    (Kleppmann's fencing token);
  * ``~occurrence/<occurrence id>/<step>`` is written only if absent: a
    step's effects land once per occurrence, also when a frozen holder
    committed them just before the next run reached the same step, or when a
    worker was killed between its commit and its ack (the later run's commit
    finds the step done, applies nothing and returns False).

What is guaranteed: effects committed through ``commit`` happen once per
occurrence and step; handler code runs at least once (a retry, a frozen
holder that resumes); a run that lost the occurrence is refused with
``Superseded`` and recorded as superseded in the run log (``run/<occurrence
id>`` in the ``coordination/system/jobs`` table), which the jobs page shows.
The guard entries expire after ``GUARD_TTL_MS`` (7 days): a holder frozen for
longer than that between its ``still_holds()`` and its commit is the one case
not covered. Tables that list their entries without a prefix must skip keys
starting with ``~`` (the guards').
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from botmesh_admin.kv import ABSENT, ConflictError, DurableKv, Entry, Op, Put
from botmesh_admin.kv.cas import cas_retry

from .base import LeaseLost, validate_key
from .core import default_replica_id
from .fencing import FENCE_CAS_ATTEMPTS

log = logging.getLogger("botmesh.coordination.jobs")

GUARD_PREFIX = "~occurrence/"
GUARD_TTL_MS = 7 * 24 * 3600 * 1000
RUN_LOG_PREFIX = "run/"
RUN_LOG_TTL_MS = 30 * 24 * 3600 * 1000
MAX_SUPERSEDED = 20
MAX_STEP_CHARS = 200
DEFAULT_STEP = "effects"

_current: contextvars.ContextVar[OccurrenceContext | None] = contextvars.ContextVar("occurrence", default=None)


class Superseded(LeaseLost):
    """This run no longer holds its occurrence (another worker took it over, or its lease expired).

    Nothing of the refused commit was applied. ``by_token`` is the fencing token
    that holds the occurrence now (None if nobody claimed it since). HTTP 409.
    """

    code = "occurrence_superseded"

    def __init__(self, message: str, *, occurrence: str, fencing_token: int, by_token: int | None) -> None:
        super().__init__(message, occurrence=occurrence, fencing_token=fencing_token, by_token=by_token)
        self.occurrence = occurrence
        self.fencing_token = fencing_token
        self.by_token = by_token


@dataclass(frozen=True)
class SupersededRun:
    """A run of an occurrence that lost it before it finished: what the run log keeps.

    ``worker`` is the replica id (``<host>-<pid>``) that ran it, ``at_ms`` when it
    found out (epoch ms), ``by_token`` the fencing token that held the
    occurrence then (None: its lease had expired and nobody claimed it yet).
    """

    worker: str
    fencing_token: int
    attempt: int
    at_ms: int
    by_token: int | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"worker": self.worker, "token": self.fencing_token, "attempt": self.attempt,
                "at_ms": self.at_ms, "by_token": self.by_token, "reason": self.reason}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SupersededRun:
        return cls(str(data["worker"]), int(data["token"]), int(data.get("attempt", 0)), int(data["at_ms"]),
                   data.get("by_token"), str(data.get("reason", "")))  # fmt: skip


def _now_ms() -> int:
    from .services import now_ms

    return now_ms()


def run_log_table(kv: DurableKv) -> str:
    """Return the table of the run log in ``kv`` (the scheduler's own ``system`` table)."""
    from .stores import system_table

    return str(system_table(kv))


class OccurrenceContext:
    """One run of one occurrence: the claim ``(event_id, fencing_token)`` of the ledger record.

    ``journal`` is the ledger (``default_journal()`` when None) and ``kv`` the
    Kv of the run log and of ``commit`` (``default_kv()`` when None).
    """

    def __init__(
        self, *, id: str, job_id: str, scheduled_ms: int, event_id: str, fencing_token: int, attempt: int,
        journal: Any = None, kv: DurableKv | None = None, worker: str | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:  # fmt: skip
        self.id = id
        self.job_id = job_id
        self.scheduled_ms = scheduled_ms
        self.event_id = event_id
        self.fencing_token = fencing_token
        self.attempt = attempt
        self.worker = worker or default_replica_id()
        self._journal = journal
        self._kv = kv
        self._clock = clock or _now_ms
        self._lost: Superseded | None = None
        self._steps: set[tuple[str, str]] = set()

    @classmethod
    def from_record(cls, record: Any, *, journal: Any = None, kv: DurableKv | None = None) -> OccurrenceContext:
        """Return the context of the claimed ledger ``record`` (a ``job.occurrence`` ``EventRecord``)."""
        payload = record.payload
        return cls(id=record.idempotency_key, job_id=str(payload.get("job", "?")),
                   scheduled_ms=int(payload.get("scheduled_ms", 0)), event_id=record.id,
                   fencing_token=record.fencing_token, attempt=record.attempts, journal=journal, kv=kv)  # fmt: skip

    def __repr__(self) -> str:
        return f"<OccurrenceContext {self.id} token {self.fencing_token} on {self.worker}>"

    @property
    def journal(self) -> Any:
        if self._journal is None:
            from botmesh_admin.events import default_journal

            self._journal = default_journal()
        return self._journal

    @property
    def kv(self) -> DurableKv:
        if self._kv is None:
            from botmesh_admin.kv.runtime import default_kv

            self._kv = default_kv()
        return self._kv

    def to_json(self) -> dict[str, Any]:
        """Return what a ``pass_occurrence`` task gets as ``occurrence``: id, scheduled_ms, fencing_token, attempt."""
        return {"id": self.id, "scheduled_ms": self.scheduled_ms, "fencing_token": self.fencing_token,
                "attempt": self.attempt}  # fmt: skip

    def still_holds(self) -> bool:
        """Return True if this run's claim is still the occurrence's live lease in the ledger.

        One ledger read. Once False, always False for this run (the superseded
        run is recorded in the run log the first time).
        """
        if self._lost is not None:
            return False
        record = self.journal.get(self.event_id)
        now = self._clock()
        if record is not None and record.fencing_token == self.fencing_token and record.state == "leased" \
                and record.leased_until is not None and record.leased_until > now:  # fmt: skip
            return True
        by_token = record.fencing_token if record is not None and record.fencing_token != self.fencing_token else None
        if by_token is not None:
            reason = f"taken over by fencing token {by_token} (attempt {record.attempts})"
        else:
            reason = "its lease expired before it finished"
        self._supersede(by_token, reason, now)
        return False

    def check(self) -> None:
        """Raise ``Superseded`` unless ``still_holds()`` (call it before a side effect the Kv cannot fence)."""
        if not self.still_holds():
            assert self._lost is not None
            raise self._lost

    def commit(
        self, table: str, ops: Sequence[Op], *, step: str = DEFAULT_STEP, changes: Sequence[Any] | None = None,
        indexed: Any = None,
    ) -> bool:  # fmt: skip
        """Apply ``ops`` to ``table`` atomically, fenced by this run's claim; once per occurrence and ``step``.

        Return True if applied now, False if an earlier run of this occurrence
        already committed ``step`` into ``table`` (then nothing is applied: the
        effects happened once). With ``indexed`` (an ``IndexedTable``) the commit
        goes through ``indexed.commit(table, ops, changes)`` so index upkeep
        joins the same atomic commit. Raise ``Superseded`` if this run lost the
        occurrence (checked in the ledger first, then by the table's guard),
        ``ConflictError`` if one of ``ops``' own expectations fails, and
        ``ValueError`` if this run already committed ``step`` into ``table``
        (name the steps of a loop).
        """
        validate_key(step, "step")
        if len(step) > MAX_STEP_CHARS:
            raise ValueError(f"step: longer than {MAX_STEP_CHARS} characters")
        if (table, step) in self._steps:
            raise ValueError(f"step {step!r} of {self.id} was already committed into {table!r} by this run")
        kv: DurableKv = indexed.kv if indexed is not None else self.kv
        fence_key = f"{GUARD_PREFIX}{self.id}"
        step_key = f"{fence_key}/{step}"

        def attempt() -> bool:
            self.check()  # the ledger: refuses a run whose lease lapsed, even before a newer run wrote here
            fence = kv.get(table, fence_key)
            highest = int(fence.value["token"]) if fence is not None else 0
            if highest > self.fencing_token:
                self._supersede(highest, f"a run with fencing token {highest} already committed into {table}",
                                self._clock())  # fmt: skip
                assert self._lost is not None
                raise self._lost
            now = self._clock()
            guard = [
                Put(fence_key, {"token": self.fencing_token, "worker": self.worker, "at_ms": now},
                    expect=fence.version if fence is not None else ABSENT, ttl_ms=GUARD_TTL_MS),
                Put(step_key, {"token": self.fencing_token, "worker": self.worker, "at_ms": now},
                    expect=ABSENT, ttl_ms=GUARD_TTL_MS),
            ]  # fmt: skip
            try:
                if indexed is not None:
                    indexed.commit(table, [*guard, *ops], list(changes or ()))
                else:
                    kv.commit(table, [*guard, *ops])
            except ConflictError as exc:
                if exc.key == fence_key:
                    raise  # another run moved the guard between our read and commit: look again
                if exc.key == step_key:
                    log.info("occurrence %s: step %r already committed into %s by an earlier run; not applied again",
                             self.id, step, table)  # fmt: skip
                    self._steps.add((table, step))
                    self._raise_fence(kv, table, fence_key)
                    return False
                raise
            self._steps.add((table, step))
            return True

        return cas_retry(
            attempt,
            what=f"the guard of {table}",
            attempts=FENCE_CAS_ATTEMPTS,
            retry_if=lambda miss: miss.key == fence_key,
        )

    def _raise_fence(self, kv: DurableKv, table: str, fence_key: str) -> None:
        """Raise the table's guard to this run's token (a skipped step still shuts out older runs)."""

        def attempt() -> None:
            fence = kv.get(table, fence_key)
            if fence is not None and int(fence.value["token"]) >= self.fencing_token:
                return
            value = {"token": self.fencing_token, "worker": self.worker, "at_ms": self._clock()}
            kv.commit(table, [Put(fence_key, value, expect=fence.version if fence is not None else ABSENT,
                                  ttl_ms=GUARD_TTL_MS)])  # fmt: skip

        cas_retry(attempt, what=f"the guard of {table}", attempts=FENCE_CAS_ATTEMPTS)

    def _supersede(self, by_token: int | None, reason: str, at_ms: int) -> None:
        """Remember (and record in the run log, once) that this run lost the occurrence."""
        if self._lost is not None:
            return
        self._lost = Superseded(
            f"occurrence {self.id}: the run with fencing token {self.fencing_token} is superseded: {reason}",
            occurrence=self.id, fencing_token=self.fencing_token, by_token=by_token,
        )  # fmt: skip
        log.warning("occurrence %s: run on %s (fencing token %s, attempt %s) superseded: %s; its effects are refused",
                    self.id, self.worker, self.fencing_token, self.attempt, reason)  # fmt: skip
        run = SupersededRun(self.worker, self.fencing_token, self.attempt, at_ms, by_token, reason)
        try:
            superseded_record(self.kv, self.id, run)
        except Exception as exc:  # noqa: BLE001 - the run log informs; the refusal stands without it
            log.warning("occurrence %s: could not record the superseded run: %s", self.id, type(exc).__name__)


def superseded_record(kv: DurableKv, occurrence: str, run: SupersededRun) -> None:
    """Add ``run`` to the run log of ``occurrence`` (compare-and-set; one entry per fencing token)."""
    table = run_log_table(kv)
    key = RUN_LOG_PREFIX + occurrence

    def attempt() -> None:  # another run of the same occurrence may write meanwhile: cas_retry merges again
        entry = kv.get(table, key)
        value: dict[str, Any] = dict(entry.value) if entry is not None else {"occurrence": occurrence}
        runs = [r for r in value.get("superseded", []) if int(r.get("token", 0)) != run.fencing_token]
        value["superseded"] = [*runs, run.to_json()][-MAX_SUPERSEDED:]
        kv.commit(table, [Put(key, value, expect=entry.version if entry is not None else ABSENT,
                              ttl_ms=RUN_LOG_TTL_MS)])  # fmt: skip

    cas_retry(attempt, what=f"the run log of {occurrence}", attempts=FENCE_CAS_ATTEMPTS)


def superseded_get_many(kv: DurableKv, occurrences: Sequence[str]) -> dict[str, tuple[SupersededRun, ...]]:
    """Return the superseded runs of each of ``occurrences`` that has any (one ``get_many`` per 1,000)."""
    table = run_log_table(kv)
    found: dict[str, tuple[SupersededRun, ...]] = {}
    ids = list(dict.fromkeys(occurrences))
    for start in range(0, len(ids), 1000):
        chunk = ids[start : start + 1000]
        entries: list[Entry | None] = kv.get_many(table, [RUN_LOG_PREFIX + o for o in chunk])
        for occurrence, entry in zip(chunk, entries, strict=True):
            if entry is not None and entry.value.get("superseded"):
                found[occurrence] = tuple(SupersededRun.from_json(r) for r in entry.value["superseded"])
    return found


def current_occurrence() -> OccurrenceContext | None:
    """Return the occurrence run this code runs in (inside a task the runner called), or None."""
    return _current.get()


@contextmanager
def running(occurrence: OccurrenceContext) -> Iterator[OccurrenceContext]:
    """Make ``occurrence`` the ``current_occurrence()`` for the duration of the block (the runner)."""
    token = _current.set(occurrence)
    try:
        yield occurrence
    finally:
        _current.reset(token)
