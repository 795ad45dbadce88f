"""Secondary indexes inside the DurableKv (ARCHITECTURE §4, "Indexes").

The FoundationDB Record Layer model over our ordered key-value contract: an
index lives in the same table as the records it indexes and is maintained **in
the same atomic commit** as the record change, so a reader never sees a record
without its index entries or the reverse. A package declares its indexes once,
next to its store (a ``RecordType`` per kind of record), and hands every record
change to ``IndexedTable.commit``; this module turns ``old → new`` into the
index operations. No package writes index upkeep by hand.

Two kinds of index:

- ``ValueIndex`` — an entry per record (or per element of a multi-valued field)
  at ``x/<index>/<encoded values><primary key>``, ordered by the encoded values,
  so a page of any filter on a prefix of those values is one ``scan``. The entry
  holds ``{"pk": <record key>, ...payload}``; a payload that copies what a list
  row shows (a *covering* index) saves fetching the records.
- ``CountIndex`` — a counter per group at ``x/<index>/<encoded group>``, kept
  with the conflict-free ``Add`` op, so hot counters never serialise writers and
  a count is one ``get``. A record may add an ``amount`` other than 1 (a sum).

Key encoding (``encode``) preserves the order of tuples of ``None``, booleans,
integers and strings, component by component: every component is a type tag
followed by its body and ends with a space (the lowest character a key may
hold); a space inside a string is written ``!!`` and a ``!`` as ``!"``, which
keeps both the order and the end of the component unambiguous. Integers are
19 digits after a sign tag (``3`` negative, ``4`` otherwise), within ±10**19.
``Desc(field)`` orders an integer field newest/largest first.

Index state. Each index of a table has a state entry at ``x/<index>`` (no
trailing slash): absent, ``building`` (with the primary key the builder has
reached) or ``built``. Writers maintain an index for every record when it is
built, and only for records the builder has passed while it builds; a commit
proves that the states it read still hold, so a writer that read a state the
builder has since moved retries with the new state (never a lost or
double-counted entry). The proof is one ``Check`` per table on the hot path:
every change of a state's value (a first write, clearing, building, built)
also adds to the table's epoch ``x/~epoch`` in the same commit, so a writer
whose indexes are all built checks the epoch's version alone (one op instead of
one per index); a writer that maintains an index not built yet checks that
state entry's version itself (a build's cursor moves without the epoch, since
only those writers care where it is). Kv versions restart after a ``drop``, so
an epoch created by a table's first write must mean the same in every
incarnation: that write marks every index whose record type has no record yet,
not only its own. Reads use an index only once it is built
(``IndexNotBuilt`` otherwise, naming ``manage.py botmesh_reindex``). A table
with no record of a type builds that type's indexes on its first write, so new
installations never need the command; tables written before an index was
declared get it from ``IndexedTable.build`` (online, resumable, safe under writes).
An index whose entries change shape in a release declares a new
``generation``; its built state records the generation it was built at, and a
table built at another one reads as ``stale`` — refused to readers, kept by
writers, rebuilt by ``build`` — so only that index waits for the command.

Records with a TTL may have value indexes (their entries expire with them) but
no count index: an expiry is not a change this module sees.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from botmesh_admin.errors import StoreUnavailable, ValidationError
from botmesh_admin.pagination import validate_limit

from .base import (
    ABSENT,
    ANY,
    Add,
    Check,
    ConflictError,
    Delete,
    DurableKv,
    Entry,
    Expect,
    JsonValue,
    Op,
    Put,
    ScanFollow,
    ScanMerge,
)
from .cas import cas_retry
from .encoding import prefix_end
from .tablecache import TableCache
from .validation import MAX_GET_MANY, follow_key, validate_scan_merge

__all__ = [
    "Desc",
    "Each",
    "CountIndex",
    "IndexNotBuilt",
    "IndexedTable",
    "RecordChange",
    "RecordType",
    "ValueIndex",
    "decode",
    "encode",
    "encode_component",
]

INDEX_ROOT = "x/"
_TERMINATOR = " "
_INT_BOUND = 10**19
MAX_COMMIT_RETRIES = 50


class _ReadAgain(Exception):
    """An index state or a record read for its upkeep moved before the commit: ``cas_retry`` reads again."""


# -- order-preserving key encoding ------------------------------------------------


def encode_component(value: object) -> str:
    """Return the order-preserving encoding of one key component (ends with a space).

    ``None`` < ``False`` < ``True`` < integers (by value) < strings (by code
    point). Raise ``ValidationError`` (field ``index``) for any other type or an
    integer outside ±10**19.
    """
    if isinstance(value, str):  # the most common component first
        if "!" in value or " " in value:
            value = value.replace("!", '!"').replace(" ", "!!")
        return "s" + value + _TERMINATOR
    if value is None:
        return "0" + _TERMINATOR
    if value is False:
        return "1" + _TERMINATOR
    if value is True:
        return "2" + _TERMINATOR
    if isinstance(value, int):
        if not -_INT_BOUND < value < _INT_BOUND:
            raise ValidationError("index", f"integer {value} outside ±10**19 cannot be indexed")
        if value < 0:
            return f"3{_INT_BOUND + value:019d}" + _TERMINATOR
        return f"4{value:019d}" + _TERMINATOR
    raise ValidationError("index", f"a {type(value).__name__} cannot be an index key component")


def encode(values: Sequence[object]) -> str:
    """Return the concatenated encoding of ``values`` (a tuple's order is the key order)."""
    return "".join([encode_component(v) for v in values])


def decode(text: str) -> tuple[object, ...]:
    """Return the values whose ``encode`` is ``text`` (its inverse, e.g. a ``count_prefix`` group).

    Raise ``ValueError`` if ``text`` is not a sequence of encoded components.
    """
    values: list[object] = []
    i = 0
    while i < len(text):
        tag = text[i]
        if tag in "012":
            values.append({"0": None, "1": False, "2": True}[tag])
            i += 1
        elif tag in "34":
            digits = text[i + 1 : i + 20]
            if len(digits) != 19 or not digits.isdigit():
                raise ValueError(f"not an encoded integer at {i} of {text!r}")
            values.append(int(digits) - _INT_BOUND if tag == "3" else int(digits))
            i += 20
        elif tag == "s":
            chars: list[str] = []
            i += 1
            while i < len(text) and text[i] != _TERMINATOR:
                if text[i] == "!":
                    escaped = text[i + 1 : i + 2]
                    if escaped not in ("!", '"'):
                        raise ValueError(f"a bad escape at {i} of {text!r}")
                    chars.append(" " if escaped == "!" else "!")
                    i += 2
                else:
                    chars.append(text[i])
                    i += 1
            values.append("".join(chars))
        else:
            raise ValueError(f"no encoded component at {i} of {text!r}")
        if text[i : i + 1] != _TERMINATOR:
            raise ValueError(f"a component of {text!r} does not end at {i}")
        i += 1
    return tuple(values)


# -- declarations -------------------------------------------------------------------


@dataclass(frozen=True)
class Desc:
    """An integer field ordered largest first (newest first for times)."""

    field: str


@dataclass(frozen=True)
class Each:
    """A multi-valued field (a list): the record is listed once per distinct element."""

    field: str


FieldSpec = str | Desc | Each


def _lookup(record: Mapping[str, Any], path: str) -> Any:
    value: Any = record
    for part in path.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def _plain_names(fields: Sequence[FieldSpec]) -> tuple[str, ...] | None:
    """Return ``fields`` when each is a top-level field name (no ``Desc``, ``Each`` or path), else ``None``."""
    if all(type(spec) is str and "." not in spec for spec in fields):
        return tuple(cast(Sequence[str], fields))
    return None


def _tuples(record: Mapping[str, Any], fields: Sequence[FieldSpec]) -> list[tuple[Any, ...]]:
    """Return every tuple of field values the record is indexed under (``Each`` multiplies)."""
    out: list[tuple[Any, ...]] = [()]
    for spec in fields:
        if isinstance(spec, Each):
            items = _lookup(record, spec.field)
            values = sorted(set(items), key=encode_component) if isinstance(items, list) else []
        elif isinstance(spec, Desc):
            value = _lookup(record, spec.field)
            values = [None if value is None else -int(value)]
        else:
            values = [_lookup(record, spec)]
        out = [t + (v,) for t in out for v in values]
    return out


Where = Callable[[Mapping[str, Any]], bool]


@dataclass(frozen=True)
class ValueIndex:
    """An ordered index: ``x/<name>/<encoded fields><primary key>`` → ``{"pk", **payload}``.

    ``fields``: field paths (``"status"``, ``"consent.whatsapp"``), ``Desc`` or
    ``Each`` specs, in key order. ``keys`` instead computes the value tuples
    from the record (a derived value, such as folded name tokens); it wins over
    ``fields``. ``where`` keeps only the records it accepts. ``payload`` is the
    copy stored in each entry (``None``: only the primary key).

    ``reads``: the top-level fields ``keys``, ``where`` and ``payload`` read
    (``None``: unknown, the entries are computed for every change). A change
    that leaves all of them equal cannot move an entry, so its upkeep is
    skipped without computing any (a projected message changes a
    conversation's activity, not the name its search keys fold).
    ``generation``: bump it when what the entries hold changes (their keys or
    payload); tables built at an older generation read as not built
    (``IndexNotBuilt``) until ``build`` rebuilds them, while writers keep
    maintaining them. ``readable_from``: the oldest generation whose entries
    this generation's readers still read correctly (a payload field added
    that readers do without when absent, key families dropped that they no
    longer scan); a table built at such a generation stays readable, and
    ``build`` upgrades it in place (every record's entries rewritten, then
    the entries no record has any more deleted) instead of clearing it.
    """

    name: str
    fields: tuple[FieldSpec, ...] = ()
    keys: Callable[[Mapping[str, Any]], Iterable[tuple[Any, ...]]] | None = None
    where: Where | None = None
    payload: Callable[[Mapping[str, Any]], Mapping[str, JsonValue]] | None = None
    reads: tuple[str, ...] | None = None
    generation: int = 1
    readable_from: int | None = None
    # Worked out once (the upkeep's hot path): the keys' prefix, and ``fields`` when all are plain names.
    _base: str = field(init=False, repr=False, compare=False, default="")
    _plain: tuple[str, ...] | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_base", f"{INDEX_ROOT}{self.name}/")
        object.__setattr__(self, "_plain", _plain_names(self.fields) if self.keys is None else None)

    def entries(self, pk: str, record: Mapping[str, Any] | None) -> dict[str, JsonValue]:
        """Return ``{index key: entry value}`` of ``record`` stored at primary key ``pk``."""
        if record is None or (self.where is not None and not self.where(record)):
            return {}
        value: dict[str, JsonValue] = {"pk": pk}
        if self.payload is not None:
            value.update(self.payload(record))
        base = self._base
        if self._plain is not None:  # one tuple of top-level fields
            return {base + "".join([encode_component(record.get(name)) for name in self._plain]) + pk: value}
        tuples = self.keys(record) if self.keys is not None else _tuples(record, self.fields)
        return {base + encode(t) + pk: value for t in tuples}


@dataclass(frozen=True)
class CountIndex:
    """A counter per group: ``x/<name>/<encoded group>`` → an integer (kept with ``Add``).

    ``fields`` / ``keys`` / ``where`` as for ``ValueIndex`` give the groups a
    record counts in; ``amount`` is what it adds to each (1, or a field such as
    a conversation's inbound message count). ``reads`` and ``generation`` as
    for ``ValueIndex`` (``reads`` covers ``amount`` too).
    """

    name: str
    fields: tuple[FieldSpec, ...] = ()
    keys: Callable[[Mapping[str, Any]], Iterable[tuple[Any, ...]]] | None = None
    where: Where | None = None
    amount: Callable[[Mapping[str, Any]], int] | None = None
    reads: tuple[str, ...] | None = None
    generation: int = 1
    _base: str = field(init=False, repr=False, compare=False, default="")
    _plain: tuple[str, ...] | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_base", f"{INDEX_ROOT}{self.name}/")
        object.__setattr__(self, "_plain", _plain_names(self.fields) if self.keys is None else None)

    def contributions(self, record: Mapping[str, Any] | None) -> dict[str, int]:
        """Return ``{counter key: amount}`` that ``record`` adds."""
        if record is None or (self.where is not None and not self.where(record)):
            return {}
        amount = 1 if self.amount is None else int(self.amount(record))
        if amount == 0:
            return {}
        base = self._base
        if self._plain is not None:
            return {base + "".join([encode_component(record.get(name)) for name in self._plain]): amount}
        tuples = self.keys(record) if self.keys is not None else _tuples(record, self.fields)
        return {base + encode(t): amount for t in tuples}


Index = ValueIndex | CountIndex


@dataclass(frozen=True)
class RecordType:
    """A kind of record in a table: the key prefix its records sit under and its indexes.

    ``decode`` turns a stored value into the mapping the indexes read (the
    default is the value itself); ``ttl`` is True for records written with a TTL
    (then only value indexes are allowed).

    ``reuses_keys``: a deleted record's key may be written again. Kv versions
    restart at 1 for a re-created key, so a writer that read version 1 of the
    old record could still commit over the new one with an ``old`` value that
    is no longer stored (the ABA case), and the index would keep the wrong
    entries. For such types ``IndexedTable.commit`` reads the stored values of
    the changed records itself, just before committing, and uses those as
    ``old`` (one ``get_many``). Declare ``False`` only where keys are never
    reused (ids that are never handed out twice): the caller's ``old`` is then
    trusted and the read is saved.
    """

    name: str
    prefix: str
    indexes: tuple[Index, ...]
    decode: Callable[[JsonValue], Mapping[str, Any]] | None = None
    ttl: bool = False
    reuses_keys: bool = True

    def __post_init__(self) -> None:
        names = [i.name for i in self.indexes]
        if len(set(names)) != len(names):
            raise ValueError(f"record type {self.name}: an index name repeats")
        if self.ttl and any(isinstance(i, CountIndex) for i in self.indexes):
            raise ValueError(f"record type {self.name}: a record with a TTL cannot be counted")
        if self.prefix.startswith(INDEX_ROOT) or not self.prefix:
            raise ValueError(f"record type {self.name}: prefix {self.prefix!r} is reserved")
        for index in self.indexes:
            if isinstance(index.generation, bool) or not isinstance(index.generation, int) or index.generation < 1:
                raise ValueError(f"index {index.name}: generation must be an integer >= 1")
            readable_from = getattr(index, "readable_from", None)
            if readable_from is not None and (
                isinstance(readable_from, bool)
                or not isinstance(readable_from, int)
                or not 1 <= readable_from < index.generation
            ):
                raise ValueError(f"index {index.name}: readable_from must be an integer from 1 to generation - 1")
            if index.reads is not None and (
                isinstance(index.reads, str) or not all(isinstance(f, str) and f for f in index.reads)
            ):
                raise ValueError(f"index {index.name}: reads must be a tuple of field names")

    def view(self, value: JsonValue | None) -> Mapping[str, Any] | None:
        """Return the mapping the indexes read for a stored ``value`` (``None`` stays ``None``)."""
        if value is None:
            return None
        return self.decode(value) if self.decode is not None else value


@dataclass(frozen=True)
class RecordChange:
    """One record's change inside a commit: ``old`` → ``new`` (``None`` for absent).

    ``old`` must be the value at the version the commit expects (or the commit
    must otherwise guarantee it); ``ttl_ms`` is the TTL the record is written
    with, which its value-index entries get too.
    """

    record: RecordType
    key: str
    old: JsonValue | None
    new: JsonValue | None
    ttl_ms: int | None = None


class IndexNotBuilt(StoreUnavailable):
    """An index a read needs is not built yet in this table (run ``botmesh_reindex``)."""

    code = "index_not_built"

    def __init__(self, table: str, index: str) -> None:
        super().__init__(f"index {index!r} of {table!r} is not built yet; run `manage.py botmesh_reindex`")
        self.table = table
        self.index = index


# -- states ---------------------------------------------------------------------------

BUILT = "built"
BUILDING = "building"
CLEARING = "clearing"
STALE = "stale"
"""Built at another ``generation`` than the declared one (never stored: what a stored ``built`` reads as).

Writers maintain a stale index as if built (a rebuild starts by clearing it
anyway); reads refuse it (``IndexNotBuilt``) unless the declaration's
``readable_from`` admits its generation; ``build`` rebuilds it (or upgrades it
in place, when readable).
"""
UPGRADING = "upgrading"
"""A readable stale value index being upgraded in place: ``from`` (its generation), ``generation`` (the
target), ``phase`` (``records``: every record's entries rewritten; ``entries``: those no record has
deleted) and ``after`` (the phase's cursor). Readable, and kept by writers, throughout."""
_EVERY_KEY = frozenset((BUILT, STALE, UPGRADING))
"""The states whose index writers maintain for every record (``_State.covers``)."""


def _readable_at(index: Index, generation: int | None) -> bool:
    """Return True if entries of ``generation`` serve the reads of ``index``'s declared generation."""
    readable_from = getattr(index, "readable_from", None)
    return readable_from is not None and generation is not None and readable_from <= generation < index.generation


def _upgrading_state(origin: int | None, index: Index, phase: str, after: str | None = None) -> dict[str, JsonValue]:
    """Return the value of an ``UPGRADING`` state entry: from ``origin`` to ``index``'s generation, in ``phase``."""
    return {"state": UPGRADING, "from": origin, "generation": index.generation, "phase": phase, "after": after}


def _built_state(index: Index) -> dict[str, JsonValue]:
    """Return the value of ``index``'s state entry once built (its generation, if not the first)."""
    return {"state": BUILT} if index.generation == 1 else {"state": BUILT, "generation": index.generation}


def state_key(index: str) -> str:
    """Return the key of an index's state entry (``x/<index>``)."""
    return f"{INDEX_ROOT}{index}"


EPOCH_KEY = f"{INDEX_ROOT}~epoch"
"""The table's index epoch: a counter every change of any index state of the table adds to.

Its version moves whenever a state does, so a writer whose indexes are all
built checks this one entry instead of one state entry per index (see
``IndexedTable.commit``). ``~`` is in no index name.
"""


def _bump_epoch() -> Add:
    """Return the op every commit that changes an index state carries (an ``Add`` never conflicts)."""
    return Add(EPOCH_KEY, 1)


COMPANION_TTL_MS = 24 * 3600 * 1000
"""How long a deleted record's companion (``x/~/<key>``) outlives it: longer than any writer holds a read."""


def companion_key(key: str) -> str:
    """Return the key of a record's companion, whose version counts its writes across incarnations."""
    return f"{INDEX_ROOT}~/{key}"


def _expect_of(ops: Sequence[Op], key: str) -> Expect:
    return next((op.expect for op in ops if op.key == key), ANY)


def activity_key(index: str) -> str:
    """Return the counter writers bump while a count index builds (``x/<index>:w``).

    A writer that changes a record the builder has not reached yet adds 1 to it
    (an ``Add`` never conflicts with other writers); the builder's batch checks
    its version, so a record created between the builder's scan and its commit
    makes the batch read again instead of being skipped by the cursor.
    """
    return f"{INDEX_ROOT}{index}:w"


@dataclass
class _State:
    """An index's state as last read: ``None`` state means the entry is absent."""

    state: str | None
    version: int | None
    after: str | None = None
    generation: int = 1
    readable: bool = False  # stale or upgrading, yet readable (the declaration's readable_from)
    origin: int | None = None  # upgrading: the generation it is upgraded from
    phase: str | None = None  # upgrading: "records" or "entries"

    def covers(self, pk: str, counted: bool) -> bool:
        """Return True if writers must maintain the index for primary key ``pk``.

        While an index builds, value entries are idempotent, so writers keep
        them for every record (the builder's puts agree with theirs); counters
        are not, so writers count only what the builder has passed and the
        builder counts the rest.
        """
        if self.state in _EVERY_KEY:
            return True
        if self.state == BUILDING:
            return not counted or (self.after is not None and pk <= self.after)
        return False


class _StateCache:
    """Per-process cache of a table's built indexes and its epoch version (a ``TableCache``).

    Per table: the epoch's version and the built indexes' state versions, read
    in one snapshot (``IndexedTable._states``); states other than built are
    read every time. Whatever forgets one index of a table forgets the table.
    """

    def __init__(self, size: int = 50_000) -> None:
        self._tables: TableCache[tuple[int | None, dict[str, int]]] = TableCache(size)

    def table(self, kv: DurableKv, table: str) -> tuple[int | None, dict[str, int]] | None:
        """Return ``(epoch version or None if absent, {built index: state version})`` or ``None``."""
        return self._tables.get(kv, table)

    def put_table(self, kv: DurableKv, table: str, epoch: int | None, built: dict[str, int]) -> None:
        self._tables.put(kv, table, (epoch, dict(built)))

    def get(self, kv: DurableKv, table: str, index: str) -> int | None:
        """Return the cached version of ``index``'s built state (``None``: not cached as built)."""
        item = self.table(kv, table)
        return None if item is None else item[1].get(index)

    def forget(self, kv: DurableKv, table: str, index: str | None = None) -> None:
        self._tables.forget(kv, table)


_built = _StateCache()


def forget_cached_states(kv: DurableKv, table: str) -> None:
    """Drop what this process caches of ``table``'s index states read through ``kv``.

    For a Kv object about to be discarded (``BufferedKv``): the cache is keyed
    by the object's identity, which a later object may reuse.
    """
    _built.forget(kv, table)


# -- the table -------------------------------------------------------------------------


@dataclass
class IndexedTable:
    """The record types of one kind of table (all tenants), and their upkeep and reads.

    Stores build one per table layout at import time and call ``commit``
    instead of ``kv.commit`` for every write that changes an indexed record.
    """

    kv: DurableKv
    records: tuple[RecordType, ...]
    _by_index: dict[str, tuple[RecordType, Index]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._by_index = {}
        for record in self.records:
            for index in record.indexes:
                if index.name in self._by_index:
                    raise ValueError(f"index {index.name!r} is declared twice")
                self._by_index[index.name] = (record, index)

    def index_names(self) -> list[str]:
        """Return the names of every declared index."""
        return list(self._by_index)

    # states

    def _states(self, table: str, names: Iterable[str]) -> tuple[dict[str, _State], int | None]:
        """Return index states (at least the named ones) and the epoch's version (``None``: absent).

        From the cache when every named index is cached as built; otherwise the
        state of every declared index and the epoch are read in one ``get_many``
        (one snapshot), and the built ones are cached with that epoch.
        """
        wanted = list(names)
        cached = _built.table(self.kv, table)
        if cached is not None and all(n in cached[1] for n in wanted):
            epoch, built = cached
            return {n: _State(BUILT, built[n]) for n in wanted}, epoch
        every = list(self._by_index)
        entries = self.kv.get_many(table, [*(state_key(n) for n in every), EPOCH_KEY])
        states = {n: self._read_state(n, e) for n, e in zip(every, entries[:-1], strict=True)}
        epoch = None if entries[-1] is None else entries[-1].version
        built = {n: st.version for n, st in states.items() if st.state == BUILT and st.version is not None}
        _built.put_table(self.kv, table, epoch, built)
        return states, epoch

    def _has_records(self, table: str, record: RecordType) -> bool:
        return bool(self.kv.scan(table, prefix=record.prefix, limit=1))

    # writes

    def commit(self, table: str, ops: Sequence[Op], changes: Sequence[RecordChange]) -> list[Entry | None]:
        """Commit ``ops`` with the index upkeep of ``changes``; return the results of ``ops``.

        ``ops`` are the store's own operations (the records themselves and
        anything else); ``changes`` describe each indexed record they change.
        Raise ``ConflictError`` when one of ``ops``' expectations fails (never
        for an index state that moved: that is retried here).
        """
        names = sorted({i.name for c in changes for i in c.record.indexes})
        given = len(ops)

        def attempt() -> list[Entry | None]:
            safe_ops, safe_changes, guards = self._read_olds(table, ops, changes)
            states, epoch = self._states(table, names)
            extra, verified = self._state_ops(table, names, states, epoch)
            index_ops = upkeep_ops(safe_changes, states)
            own = {op.key for op in safe_ops}
            clash = [op.key for op in index_ops + extra if op.key in own]
            if clash:
                raise ValueError(f"store ops write index keys {clash[:3]}")
            try:
                results = self.kv.commit(table, [*safe_ops, *index_ops, *extra])
            except ConflictError as exc:
                if exc.key == EPOCH_KEY or exc.key[len(INDEX_ROOT) :] in self._by_index:
                    _built.forget(self.kv, table)  # a state moved: read them again
                    raise _ReadAgain() from exc
                if exc.key in guards:
                    record_key, retry = guards[exc.key]
                    if retry:
                        raise _ReadAgain() from exc  # an unconditional write whose record moved after it was read
                    # another incarnation of the record: to the store, its version check failed
                    raise ConflictError(table, record_key, _expect_of(ops, record_key), None) from None
                raise
            if verified is not None:
                # This commit checked or wrote each of ``verified`` as built and moved the
                # epoch: cache them with the epoch's new version.
                tail = results[len(safe_ops) + len(index_ops) :]
                written = {
                    op.key: r for op, r in zip(extra, tail, strict=True) if isinstance(op, Put | Add) and r is not None
                }
                built = {
                    n: written[state_key(n)].version if state_key(n) in written else states[n].version for n in verified
                }
                bumped = written.get(EPOCH_KEY)
                if bumped is not None and all(v is not None for v in built.values()):
                    _built.put_table(self.kv, table, bumped.version, cast(dict[str, int], built))
            return results[:given]

        return cas_retry(
            attempt,
            what=f"index states of {table!r}",
            attempts=MAX_COMMIT_RETRIES,
            retry_on=_ReadAgain,
            exhausted=lambda: StoreUnavailable(f"index states of {table!r} kept moving; try again"),
        )

    def _state_ops(
        self, table: str, names: Sequence[str], states: dict[str, _State], epoch: int | None
    ) -> tuple[list[Op], list[str] | None]:
        """Return the ops that make a commit safe against index state changes, and what they verify.

        The fast path (every index the commit maintains is built and the epoch
        exists) is one ``Check`` of the epoch: every state change adds to it.
        Otherwise each index's state is checked (or, on a table's first record
        of a type, written as built; then every other index whose record type
        has no record yet too, so an epoch created by a first write means
        "all built" in any incarnation of the table), and a commit that writes
        a state, or finds every state built in a table without an epoch, adds
        to the epoch. The second value lists the indexes the commit verifies as
        built together with moving the epoch (``None`` when it does not move it).
        """
        if not names:
            return [], None
        if epoch is not None and all(states[n].state == BUILT for n in names):
            return [Check(EPOCH_KEY, epoch)], None
        extra: list[Op] = []
        fresh: list[str] = []
        for name in names:
            st = states[name]
            if st.state is None:
                if not self._has_records(table, self._by_index[name][0]):
                    fresh.append(name)
                    st.state = BUILT  # maintained in this commit, marked built with it
                else:
                    extra.append(Check(state_key(name), ABSENT))
            else:
                assert st.version is not None
                extra.append(Check(state_key(name), st.version))
        if fresh:
            empty: dict[str, bool] = {}
            for name, (record, _) in self._by_index.items():
                if name in names or name not in states or states[name].state is not None:
                    continue
                if record.name not in empty:
                    empty[record.name] = not self._has_records(table, record)
                if empty[record.name]:
                    fresh.append(name)
            extra += [Put(state_key(n), _built_state(self._by_index[n][1]), ABSENT) for n in fresh]
        if not fresh and not all(states[n].state == BUILT for n in names):
            return extra, None
        extra.append(_bump_epoch())
        # Only what is built is verified: a commit that writes a type's first record may
        # also maintain an index still building (or absent), which must not be cached as built.
        built = [n for n in names if states[n].state == BUILT]
        return extra, [*built, *(n for n in fresh if n not in names)]

    def _read_olds(
        self, table: str, ops: Sequence[Op], changes: Sequence[RecordChange]
    ) -> tuple[list[Op], list[RecordChange], dict[str, tuple[str, bool]]]:
        """Return ``ops`` and ``changes`` made safe for records whose keys are reused.

        Kv versions restart at 1 when a deleted key is written again, so a
        version expectation cannot tell two incarnations of a record apart (the
        ABA case). For each such record this reads the stored value and its
        *companion* ``x/~/<key>`` (one ``get_many``), uses the stored value as
        ``old``, and writes the companion expecting the version read. The
        companion is never deleted while its record exists and outlives a
        deleted record by ``COMPANION_TTL_MS``, so its version only grows: a
        writer that read another incarnation conflicts on it. A store op that
        writes such a record unconditionally (``ANY``) is made to expect the
        version read. Return also ``{companion or record key: (record key,
        retry)}`` telling ``commit`` what a conflict on those keys means.
        """
        reused = [c for c in changes if c.record.reuses_keys]
        if not reused:
            return list(ops), list(changes), {}
        by_key = {op.key: op for op in ops}
        keys = [c.key for c in reused] + [companion_key(c.key) for c in reused]
        found = dict(zip(keys, self.kv.get_many(table, keys), strict=True))
        guards: dict[str, tuple[str, bool]] = {}
        new_ops: list[Op] = []
        for op in ops:
            current = found.get(op.key)
            if op.key in found and op.expect is ANY and isinstance(op, (Put, Delete)):
                expect: Expect = ABSENT if current is None else current.version
                op = Put(op.key, op.value, expect, op.ttl_ms) if isinstance(op, Put) else Delete(op.key, expect)
                guards[op.key] = (op.key, True)
            new_ops.append(op)
        new_changes: list[RecordChange] = []
        for c in changes:
            if not c.record.reuses_keys:
                new_changes.append(c)
                continue
            own = by_key.get(c.key)
            if own is None or own.expect is not ABSENT:
                stored = found[c.key]
                c = replace(c, old=None if stored is None else stored.value)
            new_changes.append(c)
            companion = companion_key(c.key)
            seen = found[companion]
            ttl = COMPANION_TTL_MS if c.new is None else None
            new_ops.append(Put(companion, 0, ABSENT if seen is None else seen.version, ttl))
            guards[companion] = (c.key, c.key in guards)
        return new_ops, new_changes, guards

    # reads

    def _require(self, table: str, name: str) -> RecordType:
        record, _ = self._by_index[name]
        st = self._states(table, [name])[0][name]
        if st.state == BUILT or st.readable:
            return record
        if st.state is None:
            if not self._has_records(table, record):
                return record  # an empty table: nothing to index yet
            # The states were read before the records: a first write (which marks the states in the
            # commit that writes the records) may have landed in between. Read again now it is visible.
            _built.forget(self.kv, table)
            if self._states(table, [name])[0][name].state == BUILT:
                return record
        raise IndexNotBuilt(table, name)

    def scan(
        self,
        table: str,
        index: str,
        values: Sequence[object] = (),
        *,
        after: str | None = None,
        limit: int = 100,
        start: Sequence[object] | None = None,
        text_prefix: str | None = None,
    ) -> list[Entry]:
        """Return up to ``limit`` entries of value index ``index`` whose leading values are ``values``.

        Entries come in key order (the encoded fields, then the primary key);
        ``after`` is exclusive (the last entry key of the previous page);
        ``start`` (values continuing ``values``) begins the scan at that point
        inclusive, e.g. a time bound. ``text_prefix`` narrows to entries whose
        next component is a string starting with it (search by prefix: name
        tokens, phone digits). Each entry's value holds ``pk`` and the payload.
        Raise ``IndexNotBuilt`` if the index is not built.
        """
        prefix, after = self._range(table, index, values, after, start, text_prefix)
        return self.kv.scan(table, prefix=prefix, after=after, limit=limit)

    def scan_fetch(
        self,
        table: str,
        index: str,
        values: Sequence[object] = (),
        *,
        after: str | None = None,
        limit: int = 100,
        start: Sequence[object] | None = None,
        text_prefix: str | None = None,
    ) -> list[tuple[Entry, Entry | None]]:
        """Return ``scan``'s entries (same arguments), each with the record its ``pk`` names.

        The record is ``None`` when it is gone (deleted or expired since the
        entry was written: a reader re-checks what it filters on). One round
        trip where the Kv has ``ScanFollow`` (a page of an index and its
        records at one instant), else ``scan`` then ``fetch``. ``limit`` is at
        most ``MAX_GET_MANY`` (1,000). Raise ``IndexNotBuilt`` if the index is
        not built.
        """
        prefix, after = self._range(table, index, values, after, start, text_prefix)
        if isinstance(self.kv, ScanFollow):
            return self.kv.scan_follow(table, prefix=prefix, after=after, limit=limit)
        validate_limit(limit, maximum=MAX_GET_MANY)
        entries = self.kv.scan(table, prefix=prefix, after=after, limit=limit)
        return list(zip(entries, self.fetch(table, entries), strict=True))

    def scan_merge_fetch(
        self,
        table: str,
        index: str,
        groups: Sequence[Sequence[object]],
        *,
        after: str | None = None,
        limit: int = 100,
    ) -> list[tuple[Entry, Entry | None]]:
        """Return the first ``limit`` entries of several groups of value index ``index``, merged, with records.

        ``groups``: the leading values of each range (distinct, none leading
        another, at most 64), whose entries order alike by what follows them
        (``-activity``, then the record key, in every status × channel range of
        a list). Each row is ``(entry, record or None)``, ordered by what
        follows the group's prefix; ``after`` is such a suffix, the previous
        page's last (exclusive).
        One round trip where the Kv has ``ScanMerge``, else one ``scan`` per
        group and one ``get_many`` (``merged_scan``). Raise ``IndexNotBuilt``
        if the index is not built.
        """
        self._require(table, index)
        base = f"{INDEX_ROOT}{index}/"
        return merged_scan(self.kv, table, [base + encode(values) for values in groups], after, limit)

    def _range(
        self,
        table: str,
        index: str,
        values: Sequence[object],
        after: str | None,
        start: Sequence[object] | None,
        text_prefix: str | None,
    ) -> tuple[str, str | None]:
        """Return the ``(prefix, after)`` of a scan of ``index`` (see ``scan``); check the index is built."""
        self._require(table, index)
        prefix = f"{INDEX_ROOT}{index}/" + encode(values)
        if text_prefix is not None:
            prefix += encode_component(text_prefix)[: -len(_TERMINATOR)]
        if after is not None and not after.startswith(prefix):
            raise ValidationError("after", "not a cursor of this list")
        if after is None and start is not None:
            begin = prefix + encode(start)
            after = _just_before(begin)
        return prefix, after

    def count(self, table: str, index: str, groups: Sequence[Sequence[object]]) -> list[int]:
        """Return the counter of each group of count index ``index`` (0 when absent)."""
        self._require(table, index)
        base = f"{INDEX_ROOT}{index}/"
        entries = self.kv.get_many(table, [base + encode(g) for g in groups]) if groups else []
        return [int(e.value) if e is not None else 0 for e in entries]

    def count_prefix(
        self, table: str, index: str, values: Sequence[object] = (), *, limit: int = 1000
    ) -> dict[str, int]:
        """Return every counter of ``index`` under the leading ``values`` (a small group family)."""
        self._require(table, index)
        prefix = f"{INDEX_ROOT}{index}/" + encode(values)
        return {e.key[len(prefix) :]: int(e.value) for e in self.kv.scan(table, prefix=prefix, limit=limit)}

    def fetch(self, table: str, entries: Sequence[Entry]) -> list[Entry | None]:
        """Return the records the index ``entries`` point at (one ``get_many`` per ``MAX_GET_MANY`` entries)."""
        return _get_chunked(self.kv, table, [e.value["pk"] for e in entries])

    # builds

    def build(
        self,
        table: str,
        index: str,
        *,
        batch: int = 500,
        rebuild: bool = False,
        progress: Callable[[int], None] | None = None,
        swept: Callable[[int], None] | None = None,
    ) -> int:
        """Build ``index`` of ``table`` online; return how many records were indexed.

        Resumable: a killed build continues from the state's ``after`` on the
        next call. Safe under writes (see the module docstring). ``rebuild``
        first clears the index's entries (used by ``--repair``). ``progress``
        is called with the number of records indexed so far; ``swept``, during
        an in-place upgrade's second phase, with the number of entries checked.
        """
        record, idx = self._by_index[index]
        skey = state_key(index)
        done = checked = 0
        size = batch
        while True:
            entry = self.kv.get(table, skey)
            st = self._read_state(index, entry)
            if st.state == BUILT and not rebuild:
                return done
            if st.state == STALE and st.readable and not rebuild:
                assert entry is not None  # a stale state is a stored one
                upgrade = _upgrading_state(st.generation, idx, "records")
                try:  # the epoch moves: writers read the states again (and check this one's version)
                    self.kv.commit(table, [Put(skey, upgrade, entry.version), _bump_epoch()])
                except ConflictError:
                    continue
                _built.forget(self.kv, table, index)
                continue
            if st.state in (None, STALE) or (rebuild and st.state in (BUILT, UPGRADING)):
                expect = ABSENT if entry is None else entry.version
                try:
                    self.kv.commit(table, [Put(skey, {"state": CLEARING}, expect), _bump_epoch()])
                except ConflictError:
                    continue
                _built.forget(self.kv, table, index)
                rebuild = False
                continue
            assert entry is not None
            if st.state == CLEARING:
                old = self.kv.scan(table, prefix=skey + "/", limit=batch)
                if old:
                    self.kv.commit(table, [Delete(e.key) for e in old])
                    continue
                try:
                    self.kv.commit(
                        table,
                        [Put(skey, {"state": BUILDING, "after": None}, entry.version), _bump_epoch()],
                    )
                except ConflictError:
                    pass
                continue
            if st.state == UPGRADING and st.phase == "entries":
                examined = self._sweep_batch(table, index, entry, st, size)
                if examined is None:
                    return done
                size = max(10, size // 2) if examined < 0 else min(batch, size * 2)
                checked += max(0, examined)
                if swept is not None and examined > 0:
                    swept(checked)
                continue
            # BUILDING (or UPGRADING's records phase): index the next batch of records after the cursor
            guard: list[Op] = []
            if isinstance(idx, CountIndex):
                bumped = self.kv.get(table, activity_key(index))
                guard = [Check(activity_key(index), ABSENT if bumped is None else bumped.version)]
            rows = self.kv.scan(table, prefix=record.prefix, after=st.after, limit=size)
            if not rows and st.state == UPGRADING:
                try:  # every record's entries are this generation's: now delete the ones none has
                    self.kv.commit(table, [Put(skey, _upgrading_state(st.origin, idx, "entries"), entry.version)])
                except ConflictError:
                    pass
                continue
            if not rows:
                try:  # the guard too: a record created after this scan was counted by nobody
                    self.kv.commit(table, [*guard, Put(skey, _built_state(idx), entry.version), _bump_epoch()])
                except ConflictError:
                    continue
                return done
            cursor = rows[-1].key
            companion_checks: list[Op] = []
            if record.reuses_keys:
                # Read the records again with their companions in one snapshot: a version
                # seen by the scan could belong to an incarnation since replaced (see _read_olds).
                keys = [r.key for r in rows]
                both = self.kv.get_many(table, keys + [companion_key(k) for k in keys])
                rows = [r for r in both[: len(keys)] if r is not None]
                companion_checks = [
                    Check(companion_key(k), ABSENT if seen is None else seen.version)
                    for k, seen in zip(keys, both[len(keys) :], strict=True)
                ]
            changes = [RecordChange(record, r.key, None, r.value) for r in rows]
            ops: list[Op] = upkeep_ops(changes, {index: _State(BUILT, None)})
            if any(r.expires_at is not None for r in rows):
                ops = _with_ttl(ops, rows)
            checks: list[Op] = [Check(r.key, r.version) for r in rows] + companion_checks
            moved: dict[str, JsonValue] = {"state": BUILDING, "after": cursor}
            if st.state == UPGRADING:
                moved = _upgrading_state(st.origin, idx, "records", cursor)
            state_put = Put(skey, moved, entry.version)
            try:
                # No epoch move: only writers of this index care where its cursor is, and
                # they check its state entry (it is not built).
                self.kv.commit(table, [*ops, *checks, *guard, state_put])
            except ConflictError:
                size = max(10, size // 2)  # writers are busy in this range: take less at a time
                continue  # a record, the state or the writers' counter moved: read again
            size = min(batch, size * 2)
            done += len(rows)
            if progress is not None:
                progress(done)

    def _sweep_batch(self, table: str, index: str, entry: Entry, st: _State, size: int) -> int | None:
        """Delete the next ``size`` entries of an upgrading index that no record has; ``None`` once built.

        Return how many entries were examined, or -1 when a record or the
        state moved meanwhile (the batch is read again). Each deletion expects
        the entry's version, and the records it was judged against are checked
        in the same commit (with their companions, for records whose keys are
        reused), so an entry a writer has just made current is never deleted.
        """
        record, idx = self._by_index[index]
        assert isinstance(idx, ValueIndex)
        skey = state_key(index)
        found = self.kv.scan(table, prefix=skey + "/", after=st.after, limit=size)
        if not found:
            try:
                self.kv.commit(table, [Put(skey, _built_state(idx), entry.version), _bump_epoch()])
            except ConflictError:
                return -1
            return None
        pks = list(dict.fromkeys(pk for e in found if isinstance(pk := follow_key(e.value, "pk"), str)))
        companions = [companion_key(pk) for pk in pks] if record.reuses_keys else []
        read = self.kv.get_many(table, pks + companions) if pks else []
        records = dict(zip(pks, read[: len(pks)], strict=True))
        expected: set[str] = set()
        for pk, current in records.items():
            if current is not None and current.key.startswith(record.prefix):
                expected.update(idx.entries(pk, record.view(current.value)))
        doomed = [e for e in found if e.key not in expected]
        ops: list[Op] = [Delete(e.key, e.version) for e in doomed]
        if doomed:
            ops += [Check(pk, ABSENT if r is None else r.version) for pk, r in records.items()]
            ops += [
                Check(k, ABSENT if seen is None else seen.version)
                for k, seen in zip(companions, read[len(pks) :], strict=True)
            ]
        moved = _upgrading_state(st.origin, idx, "entries", found[-1].key)
        try:
            self.kv.commit(table, [*ops, Put(skey, moved, entry.version)])
        except ConflictError:
            return -1
        return len(found)

    def state(self, table: str, index: str) -> str | None:
        """Return ``built``, ``building``, ``clearing``, ``stale``, ``upgrading`` or ``None`` (never built).

        ``stale``: built at another generation than declared (``build``
        rebuilds it, or upgrades it in place when the declaration reads that
        generation); ``upgrading``: being upgraded in place (readable).
        """
        return self._read_state(index, self.kv.get(table, state_key(index))).state

    def _read_state(self, index: str, entry: Entry | None) -> _State:
        """Return the state of ``index`` in ``entry``: a ``built`` of another generation reads as ``STALE``."""
        st = _read_state(entry)
        idx = self._by_index[index][1]
        if st.state == BUILT and st.generation != idx.generation:
            st.state = STALE
            st.readable = _readable_at(idx, st.generation)
        elif st.state == UPGRADING:
            if st.generation == idx.generation and _readable_at(idx, st.origin):
                st.readable = True
            else:  # an upgrade towards another release's generation: rebuilt from scratch
                st.state, st.readable = STALE, False
        return st

    # checks

    def check(self, table: str, index: str) -> dict[str, int]:
        """Compare ``index`` with its records; return ``{"missing", "extra", "wrong"}`` counts.

        A full scan of the records and the index (a background job's cost). Only
        meaningful for a built index with no writer running on the same records
        at that instant; ``botmesh_check_indexes`` repeats a drifting table once
        before it reports, to tell drift from a concurrent write. Memory is
        bounded for a value index: its records are read a page at a time and
        their entries looked up by key (missing, wrong), and its entries counted
        (extra: the entries beyond those found) — at 1,000,000 conversations,
        holding every expected entry took 4.2 GB. A count index's counters (one
        per group) are summed in memory.
        """
        record, idx = self._by_index[index]
        if isinstance(idx, ValueIndex):
            return self._check_values(table, record, idx)
        expected: dict[str, int] = {}
        for row in _scan_all(self.kv, table, record.prefix):
            for key, amount in idx.contributions(record.view(row.value)).items():
                expected[key] = expected.get(key, 0) + amount
        actual = {e.key: e.value for e in _scan_all(self.kv, table, state_key(index) + "/") if e.value != 0}
        missing = sum(1 for k in expected if k not in actual)
        extra = sum(1 for k in actual if k not in expected)
        wrong = sum(1 for k, v in expected.items() if k in actual and actual[k] != v)
        return {"missing": missing, "extra": extra, "wrong": wrong}

    def _check_values(self, table: str, record: RecordType, idx: ValueIndex) -> dict[str, int]:
        """``check`` of a value index: the records a page at a time, their entries looked up by key.

        Every expected entry is found (or missing) by its key, so the index's
        entries that are no record's are its entry count minus those found:
        the index itself is only counted, a page at a time.
        """
        missing = wrong = expected_total = 0
        for rows in _pages(self.kv, table, record.prefix):
            expected: dict[str, JsonValue] = {}
            for row in rows:
                expected.update(idx.entries(row.key, record.view(row.value)))
            expected_total += len(expected)
            keys = list(expected)
            for key, found in zip(keys, _get_chunked(self.kv, table, keys), strict=True):
                if found is None:
                    missing += 1
                elif found.value != expected[key]:
                    wrong += 1
        actual = sum(len(page) for page in _pages(self.kv, table, state_key(idx.name) + "/"))
        return {"missing": missing, "extra": actual - (expected_total - missing), "wrong": wrong}


def _read_state(entry: Entry | None) -> _State:
    if entry is None:
        return _State(None, None)
    value = entry.value if isinstance(entry.value, Mapping) else {}
    generation = value.get("generation", 1)
    origin = value.get("from")
    return _State(
        value.get("state"),
        entry.version,
        value.get("after"),
        generation if isinstance(generation, int) else 0,
        origin=origin if isinstance(origin, int) else None,
        phase=value.get("phase"),
    )


def _just_before(key: str) -> str | None:
    """Return a string just below ``key`` in key order (an exclusive ``after`` for ``key``)."""
    if not key:
        return None
    last = key[-1]
    if last == _TERMINATOR:
        return key[:-1]
    return key[:-1] + chr(ord(last) - 1) + "\U0010ffff"


def _get_chunked(kv: DurableKv, table: str, keys: Sequence[str]) -> list[Entry | None]:
    """Return ``kv.get_many`` of ``keys``, one call per ``MAX_GET_MANY`` keys."""
    return [
        r for start in range(0, len(keys), MAX_GET_MANY) for r in kv.get_many(table, keys[start : start + MAX_GET_MANY])
    ]


def _scan_all(kv: DurableKv, table: str, prefix: str) -> Iterator[Entry]:
    for page in _pages(kv, table, prefix):
        yield from page


def _pages(kv: DurableKv, table: str, prefix: str, size: int = 1000) -> Iterator[list[Entry]]:
    """Yield the entries under ``prefix`` a page of ``size`` at a time, in key order."""
    after: str | None = None
    while True:
        page = kv.scan(table, prefix=prefix, after=after, limit=size)
        if page:
            yield page
        if len(page) < size:
            return
        after = page[-1].key


def _with_ttl(ops: list[Op], rows: Sequence[Entry]) -> list[Op]:
    """Give the value-index entries of TTL records the records' remaining TTL."""
    from botmesh_admin.clock import now_ms

    now = now_ms()
    left = {r.key: max(1, r.expires_at - now) for r in rows if r.expires_at is not None}
    out: list[Op] = []
    for op in ops:
        if isinstance(op, Put) and isinstance(op.value, Mapping) and op.value.get("pk") in left:
            out.append(Put(op.key, op.value, ttl_ms=left[op.value["pk"]]))
        else:
            out.append(op)
    return out


def upkeep_ops(changes: Sequence[RecordChange], states: Mapping[str, _State]) -> list[Op]:
    """Return the index operations for ``changes`` under ``states`` (merged, one op per key).

    For each index a writer must maintain (see ``_State.covers``): value
    entries of the old record that the new one no longer has are deleted, new
    or changed ones put (always put for a record with a TTL, so the entry's
    expiry follows the record's); count contributions become one ``Add`` per
    counter key with the net delta (zero deltas are dropped).
    """
    puts: dict[str, tuple[JsonValue, int | None]] = {}
    deletes: set[str] = set()
    adds: dict[str, int] = {}
    # Per record type, once per call: its indexes with a state, and whether every key is maintained.
    plans: dict[int, list[tuple[Index, _State, bool, bool]]] = {}
    for change in changes:
        record = change.record
        plan = plans.get(id(record))
        if plan is None:
            plan = plans[id(record)] = [
                (index, st, isinstance(index, CountIndex), st.state in _EVERY_KEY)
                for index in record.indexes
                if (st := states.get(index.name)) is not None
            ]
        old = record.view(change.old)
        new = record.view(change.new)
        ttl, pk = change.ttl_ms, change.key
        both = ttl is None and old is not None and new is not None
        for index, st, counted, every in plan:
            if not every and not st.covers(pk, counted):
                if st.state == BUILDING and counted:
                    adds[activity_key(index.name)] = 1
                continue
            reads = index.reads
            if both and reads is not None:
                for name in reads:
                    if old.get(name) != new.get(name):  # type: ignore[union-attr]
                        break
                else:
                    continue  # nothing the index reads changed: no entry or counter moves
            if counted:
                assert isinstance(index, CountIndex)
                for key, amount in index.contributions(old).items():
                    adds[key] = adds.get(key, 0) - amount
                for key, amount in index.contributions(new).items():
                    adds[key] = adds.get(key, 0) + amount
                continue
            assert isinstance(index, ValueIndex)
            before = index.entries(pk, old)
            after = index.entries(pk, new)
            for key in before:
                if key not in after:
                    deletes.add(key)
            for key, value in after.items():
                if ttl is not None or before.get(key) != value:
                    puts[key] = (value, ttl)
    ops: list[Op] = []
    for key in sorted(deletes - puts.keys()):
        ops.append(Delete(key))
    for key, (value, ttl) in sorted(puts.items()):
        ops.append(Put(key, value, ttl_ms=ttl))
    for key, delta in sorted(adds.items()):
        if delta or key.endswith(":w"):
            ops.append(Add(key, delta or 1))
    return ops


def merged_scan(
    kv: DurableKv, table: str, prefixes: Sequence[str], after: str | None, limit: int, field: str = "pk"
) -> list[tuple[Entry, Entry | None]]:
    """Return ``ScanMerge.scan_merge(table, prefixes, after, limit, field=field)`` on any Kv.

    Natively where ``kv`` has the capability (one round trip); otherwise one
    ``scan`` of ``limit`` entries per prefix (each range's first ``limit`` are
    the only ones that can make the merged first ``limit``), the merge here, and
    one ``get_many`` of the kept entries' targets (not read at one instant with
    the scans; a reader re-checks the records it filters on). Raise
    ``ValidationError`` for bad arguments (``validate_scan_merge``).
    """
    found = validate_scan_merge(table, prefixes, after, limit, field)
    if isinstance(kv, ScanMerge):
        return kv.scan_merge(table, found, after, limit, field=field)
    return merge_by_scans(kv, table, found, after, limit, field)


def merge_by_scans(
    kv: DurableKv, table: str, prefixes: Sequence[str], after: str | None, limit: int, field: str
) -> list[tuple[Entry, Entry | None]]:
    """``merged_scan`` by one ``scan`` per prefix and one ``get_many`` (arguments validated by the caller)."""
    rows: list[tuple[str, str, Entry]] = []
    for prefix in prefixes:
        start = None if after is None else prefix + after
        rows += [(e.key[len(prefix) :], e.key, e) for e in kv.scan(table, prefix=prefix, after=start, limit=limit)]
    rows.sort(key=lambda row: (row[0], row[1]))
    kept = [e for _, _, e in rows[:limit]]
    targets = [follow_key(e.value, field) for e in kept]
    wanted = [t for t in targets if t is not None]
    records = {e.key: e for e in kv.get_many(table, wanted) if e is not None} if wanted else {}
    return [(e, None if t is None else records.get(t)) for e, t in zip(kept, targets, strict=True)]


def next_page_prefix(prefix: str) -> str | None:
    """Return the first key after every key starting with ``prefix`` (re-exported helper)."""
    return prefix_end(prefix)


# -- the declarations of every package ------------------------------------------------


@dataclass(frozen=True)
class IndexedCollection:
    """A package collection (``TenantKv(kv, package).table(tenant, collection)``) with indexes.

    ``instances`` is for a layout of one table per parent record (a campaign's
    deliveries in ``d-<campaign id>``): given the Kv and a tenant, it returns
    the collection names of that tenant's tables (a background job's cost);
    ``collection`` then only names the family in reports.

    ``verify`` checks what a package derives into its records beyond these
    indexes (the CRM's segment membership): given the Kv and a tenant, it
    returns drift counts (all zero: none), and ``repair`` rebuilds it;
    ``botmesh_check_indexes`` runs both. ``derive`` brings it up to date
    (online, resumable; returns the records read): ``botmesh_reindex`` runs it.
    """

    package: str
    collection: str
    records: tuple[RecordType, ...]
    instances: Callable[[DurableKv, str], Iterable[str]] | None = None
    verify: Callable[[DurableKv, str], Mapping[str, int]] | None = None
    repair: Callable[[DurableKv, str], None] | None = None
    derive: Callable[[DurableKv, str], int] | None = None

    def layout(self, kv: DurableKv) -> IndexedTable:
        """Return the ``IndexedTable`` of this collection over ``kv``."""
        return IndexedTable(kv, self.records)

    def collections(self, kv: DurableKv, tenant: str) -> list[str]:
        """Return the collection names of ``tenant`` this declaration covers."""
        if self.instances is None:
            return [self.collection]
        return list(self.instances(kv, tenant))


_declared: dict[tuple[str, str], IndexedCollection] = {}


def declare(
    package: str,
    collection: str,
    records: Sequence[RecordType],
    *,
    instances: Callable[[DurableKv, str], Iterable[str]] | None = None,
    verify: Callable[[DurableKv, str], Mapping[str, int]] | None = None,
    repair: Callable[[DurableKv, str], None] | None = None,
    derive: Callable[[DurableKv, str], int] | None = None,
) -> IndexedCollection:
    """Declare the indexed record types of a package collection (once, next to its store).

    ``botmesh_reindex`` and ``botmesh_check_indexes`` walk these declarations;
    redeclaring the same collection replaces it (module reloads in tests).
    ``instances`` lists a tenant's tables of a one-table-per-parent layout;
    ``verify`` / ``repair`` / ``derive`` check, rebuild and build derived data (see
    ``IndexedCollection``).
    """
    collection_spec = IndexedCollection(package, collection, tuple(records), instances, verify, repair, derive)
    IndexedTable(cast(DurableKv, _NullKv()), collection_spec.records)  # refuses repeated names now
    _declared[(package, collection)] = collection_spec
    return collection_spec


def declared() -> list[IndexedCollection]:
    """Return every declared collection, importing each installed app's ``stores.kv`` first."""
    import importlib

    from django.apps import apps

    for config in apps.get_app_configs():
        try:
            importlib.import_module(f"{config.name}.stores.kv")
        except ModuleNotFoundError as exc:
            if exc.name is None or not f"{config.name}.stores.kv".startswith(exc.name):
                raise
    return [_declared[k] for k in sorted(_declared)]


class _NullKv:
    """A stand-in Kv for validating declarations (never called)."""

    url = "null://"
