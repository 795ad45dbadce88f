"""Validation of everything that reaches a DurableKv backend.

Backends call ``validate_commit`` / ``validate_table`` / ``validate_key`` first, so a
bad write raises ``ValidationError`` naming what is wrong and never reaches the
backend (ARCHITECTURE §4, "Validation before write").
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from botmesh_admin.clock import now_ms as now_ms  # re-exported: backends and tools import it from here
from botmesh_admin.errors import BadType, ValidationError
from botmesh_admin.validation import MAX_IDENTIFIER_BYTES, validate_identifier

from .base import ABSENT, ANY, MAX_COUNTER, Add, Check, Delete, Entry, Expect, Op, Put

MAX_NAME_BYTES = MAX_IDENTIFIER_BYTES  # 512
MAX_DEPTH = 64
MAX_VALUE_BYTES = 16 * 1024 * 1024
MAX_INT_DIGITS = 4000  # Python refuses to turn an int of more than 4,300 digits into text (JSON)
_INT_LIMIT = 10**MAX_INT_DIGITS
MAX_SCAN_LIMIT = 10_000
MAX_GET_MANY = 1000
_FIELD = re.compile(r"[A-Za-z0-9_]{1,64}")  # a scan_follow field: safe in a JSON path of every backend
# Versions and expiry times must fit a signed 64-bit integer (PostgreSQL bigint)
# and, for expiry times, a double exactly (Redis sorted-set scores, Lua numbers).
MAX_VERSION = 2**63 - 1
MAX_TTL_MS = 100 * 366 * 24 * 3600 * 1000  # about a century


def _validate_kv_name(value: object, field: str, *, forbid: str = "") -> str:
    return validate_identifier(value, field, max_bytes=MAX_NAME_BYTES, forbid=forbid)


def validate_table(table: object) -> str:
    """Return ``table`` if it is a valid table name, else raise ``ValidationError``.

    Table names are 1..512 UTF-8 bytes with no control characters and no braces
    (braces are reserved for the Redis Cluster hash tag).
    """
    return _validate_kv_name(table, "table", forbid="{}")


def validate_key(key: object, field: str = "key") -> str:
    """Return ``key`` if it is a valid key (1..512 UTF-8 bytes, no control characters)."""
    return _validate_kv_name(key, field)


def validate_value(value: object, field: str = "value") -> None:
    """Raise ``ValidationError`` unless ``value`` is plain JSON of at most ``MAX_VALUE_BYTES``.

    Allowed: dict with string keys, list, str, int, finite float, bool, None;
    nesting depth at most 64; integers of at most 4,000 digits; at most 16 MiB
    as compact UTF-8 JSON (the form every serialising backend stores). NaN/Infinity, bytes, sets, tuples and
    other objects are refused with the path of the offending element.
    """
    # Almost every value is made of the exact builtin types, ASCII text and small numbers:
    # ``_plain_bound`` accepts only those (about 2.3x faster: no path per element), and
    # anything else — a subclass, a big integer, a bad value — takes the full check below,
    # which names the path. Both compute the same size bound, so the 16 MiB rule is the same.
    bound = _plain_bound(value, 1)
    if 0 <= bound <= MAX_VALUE_BYTES:
        return
    _validate_value_fully(value, field)


_PLAIN_INT = 2**64


def _plain_bound(value: Any, depth: int) -> int:
    """Return ``validate_value``'s size bound of ``value`` if it is made of exact builtin types it accepts, else -1."""
    if depth > MAX_DEPTH:
        return -1
    kind = type(value)
    if kind is str:
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return -1
        return 6 * len(value) + 4
    if kind is dict:
        total = 2
        for k, v in value.items():
            if type(k) is not str:
                return -1
            if not k.isascii():
                try:
                    k.encode("utf-8")
                except UnicodeEncodeError:
                    return -1
            child = _plain_bound(v, depth + 1)
            if child < 0:
                return -1
            total += 6 * len(k) + 4 + child
        return total
    if kind is list:
        total = 2
        for v in value:
            child = _plain_bound(v, depth + 1)
            if child < 0:
                return -1
            total += child
        return total
    if kind is int:
        return 32 if -_PLAIN_INT < value < _PLAIN_INT else -1
    if value is None or kind is bool:
        return 32
    if kind is float:
        return 32 if math.isfinite(value) else -1
    return -1


def _validate_value_fully(value: object, field: str) -> None:
    """``validate_value`` for any value: raise naming the path of the first element refused."""
    # A path is the field name or (parent path, key or index), spelt out only for
    # an error: formatting one per element cost more than checking the element.
    stack: list[tuple[object, Any, int]] = [(value, field, 1)]
    # An upper bound of the encoded size: a character is at most 6 bytes (``\u001f``),
    # any other scalar at most 32, quotes and separators 4 per element. Exact only when needed.
    bound = 0
    while stack:
        item, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ValidationError(_path(path), f"nested deeper than {MAX_DEPTH} levels")
        if item is None or isinstance(item, (bool, int, str)):
            if isinstance(item, str):
                _validate_utf8(item, path)
                bound += 6 * len(item) + 4
            elif isinstance(item, int) and not -(2**64) < item < 2**64:
                if not -_INT_LIMIT < item < _INT_LIMIT:
                    raise ValidationError(_path(path), f"an integer of more than {MAX_INT_DIGITS} digits")
                bound += item.bit_length() // 3 + 4  # decimal digits <= 0.302 x bits, + sign
            else:
                bound += 32
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise ValidationError(_path(path), f"{item!r} is not a JSON number")
            bound += 32
            continue
        if isinstance(item, dict):
            for k, v in item.items():
                if not isinstance(k, str):
                    raise BadType(_path(path), f"object key {k!r} is not a string")
                _validate_utf8(k, path)
                bound += 6 * len(k) + 4
                stack.append((v, (path, k), depth + 1))
            bound += 2
            continue
        if isinstance(item, list):
            for i, v in enumerate(item):
                stack.append((v, (path, i), depth + 1))
            bound += 2
            continue
        raise BadType(_path(path), f"{type(item).__name__} is not a JSON value")
    if bound > MAX_VALUE_BYTES:
        from .encoding import dump_value

        size = len(dump_value(value).encode())
        if size > MAX_VALUE_BYTES:
            raise ValidationError(field, f"is {size} bytes as JSON; at most {MAX_VALUE_BYTES} (16 MiB)")


def _path(path: Any) -> str:
    """Spell out a path of ``validate_value``: ``value.a[2].b``."""
    pieces: list[str] = []
    while isinstance(path, tuple):
        path, key = path
        pieces.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    return str(path) + "".join(reversed(pieces))


def _validate_utf8(text: str, path: Any) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(_path(path), "string is not valid UTF-8 (lone surrogate)") from None


def validate_expect(expect: object, field: str) -> Expect:
    """Return ``expect`` if it is ``ANY``, ``ABSENT`` or a version number >= 1."""
    if expect is ANY or expect is ABSENT:
        return expect
    if isinstance(expect, bool) or not isinstance(expect, int):
        raise BadType(field, "must be ANY, ABSENT or a version number")
    if not 1 <= expect <= MAX_VERSION:
        raise ValidationError(field, f"a version number is between 1 and {MAX_VERSION}")
    return expect


def validate_limit(limit: object) -> int:
    """Return ``limit`` if it is an int in 1..10000."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise BadType("limit", "must be an integer")
    if not 1 <= limit <= MAX_SCAN_LIMIT:
        raise ValidationError("limit", f"must be between 1 and {MAX_SCAN_LIMIT}")
    return limit


def validate_sweep_limit(limit: object) -> int:
    """Return ``limit`` if it is a positive int (how many expired entries ``sweep`` may remove)."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise BadType("limit", "must be an integer")
    if limit < 1:
        raise ValidationError("limit", "must be at least 1")
    return limit


def validate_scan(table: object, prefix: object, after: object, limit: object) -> None:
    """Validate the arguments of ``scan``."""
    validate_table(table)
    if not isinstance(prefix, str):
        raise BadType("prefix", "must be a string")
    if prefix:
        validate_key(prefix, "prefix")
    if after is not None:
        validate_key(after, "after")
    validate_limit(limit)


def validate_scan_follow(table: object, prefix: object, after: object, limit: object, field: object) -> None:
    """Validate the arguments of ``scan_follow`` (a scan whose ``limit`` is at most ``MAX_GET_MANY``)."""
    validate_scan(table, prefix, after, limit)
    if isinstance(limit, int) and limit > MAX_GET_MANY:
        raise ValidationError("limit", f"at most {MAX_GET_MANY} entries per call")
    if not isinstance(field, str):
        raise BadType("field", "must be a string")
    if not _FIELD.fullmatch(field):
        raise ValidationError("field", "must be 1-64 letters, digits or underscores")


MAX_MERGE_PREFIXES = 64


def validate_scan_merge(table: object, prefixes: object, after: object, limit: object, field: object) -> list[str]:
    """Validate the arguments of ``scan_merge``; return the prefixes as a list.

    Raise ``ValidationError`` naming ``prefixes`` when there are none, more than
    ``MAX_MERGE_PREFIXES``, an empty or repeated one, or one that starts
    another (its entries would be merged twice).
    """
    if isinstance(prefixes, (str, bytes)) or not isinstance(prefixes, Sequence):
        raise BadType("prefixes", "must be a list of strings")
    found = list(prefixes)
    if not 1 <= len(found) <= MAX_MERGE_PREFIXES:
        raise ValidationError("prefixes", f"must hold 1 to {MAX_MERGE_PREFIXES} prefixes")
    for prefix in found:
        if not isinstance(prefix, str) or not prefix:
            raise ValidationError("prefixes", "each must be a non-empty string")
        validate_key(prefix, "prefixes")
    ordered = sorted(found)
    for a, b in zip(ordered, ordered[1:], strict=False):
        if b.startswith(a):
            raise ValidationError("prefixes", f"{a!r} starts {b!r}: an entry would be merged twice")
    if after is not None and not isinstance(after, str):
        raise BadType("after", "must be a string or None")
    validate_scan_follow(table, found[0], None, limit, field)
    if after:
        validate_key(found[0] + after, "after")
    return found


def follow_key(value: object, field: str) -> str | None:
    """Return the key ``scan_follow`` follows from an entry ``value``: its string ``field``, else ``None``."""
    target = value.get(field) if isinstance(value, dict) else None
    return target if isinstance(target, str) else None


class Validated(tuple[Op, ...]):
    """A batch of ops already validated whole (``validate_commit``) for its table: backends take it as it is.

    Only ``BufferedKv.flush`` makes one: the net ops it merges from commits it
    validated when they were buffered (the same keys, values and expiries; a
    merged ``Add``'s summed delta is checked there), so a flush does not pay
    for the validation a second time. A batch of any other type is validated.
    """


def validate_commit(table: object, ops: Sequence[Op]) -> None:
    """Validate a whole batch before any of it reaches the backend.

    Checks the table name, each op's type, key, value (plain JSON), expectation
    and ``ttl_ms`` (an int of milliseconds, 1..MAX_TTL_MS), that no key repeats and
    that the batch is not empty. A ``Validated`` batch for a valid table passes
    as it is.
    """
    validate_table(table)
    if type(ops) is Validated and ops:
        return
    if isinstance(ops, (str, bytes)) or not isinstance(ops, Sequence):
        raise BadType("ops", "must be a list of Put, Delete or Check")
    if not ops:
        raise ValidationError("ops", "must not be empty")
    seen: set[str] = set()
    for i, op in enumerate(ops):
        where = f"ops[{i}]"
        if not isinstance(op, (Put, Delete, Check, Add)):
            raise BadType(where, f"{type(op).__name__} is not Put, Delete, Check or Add")
        validate_key(op.key, f"{where}.key")
        if op.key in seen:
            raise ValidationError(f"{where}.key", f"key {op.key!r} appears twice in one batch")
        seen.add(op.key)
        if isinstance(op, Add):
            validate_delta(op.delta, f"{where}.delta")
            continue
        validate_expect(op.expect, f"{where}.expect")
        if isinstance(op, Put):
            validate_value(op.value, f"{where}.value")
            if op.ttl_ms is not None:
                if isinstance(op.ttl_ms, bool) or not isinstance(op.ttl_ms, int):
                    raise BadType(f"{where}.ttl_ms", "must be an integer number of milliseconds")
                if not 0 < op.ttl_ms <= MAX_TTL_MS:
                    raise ValidationError(f"{where}.ttl_ms", f"must be between 1 and {MAX_TTL_MS} milliseconds")


def validate_groups(table: object, groups: object) -> list[Sequence[Op]]:
    """Validate the groups of one ``commit_groups`` call; return them as a list.

    Each non-empty group is a valid batch (``validate_commit``; an error's field
    reads ``groups[i].ops[j]…``), and a key in more than one group is only added
    to (``Add``) in every one, or only checked (``Check``) in every one: the
    groups' writes are then disjoint, so they may be applied in any order.
    """
    validate_table(table)
    if isinstance(groups, (str, bytes)) or not isinstance(groups, Sequence):
        raise BadType("groups", "must be a list of op lists")
    kinds: dict[str, tuple[type, int]] = {}  # key -> (the op type every group has on it, first group)
    for i, ops in enumerate(groups):
        if isinstance(ops, Sequence) and not isinstance(ops, (str, bytes)) and not ops:
            continue
        try:
            validate_commit(table, ops)  # type: ignore[arg-type]
        except ValidationError as exc:
            raise type(exc)(f"groups[{i}].{exc.field}" if exc.field else f"groups[{i}]", exc.problem) from None
        for j, op in enumerate(ops):  # type: ignore[union-attr]
            kind = type(op) if isinstance(op, (Add, Check)) else Put
            first = kinds.setdefault(op.key, (kind, i))
            if first[1] != i and (kind is Put or first[0] is not kind):
                raise ValidationError(
                    f"groups[{i}].ops[{j}].key",
                    f"key {op.key!r} is in group {first[1]} too: a key in several groups must be only added to, "
                    "or only checked, in each",
                )
    return list(groups)  # type: ignore[arg-type]


def validate_delta(delta: object, field: str) -> int:
    """Return ``delta`` if it is an int within ``±MAX_COUNTER`` (an ``Add``), else raise."""
    if isinstance(delta, bool) or not isinstance(delta, int):
        raise BadType(field, "must be an integer")
    if not -MAX_COUNTER <= delta <= MAX_COUNTER:
        raise ValidationError(field, f"must be between -{MAX_COUNTER} and {MAX_COUNTER}")
    return delta


def added(current: object, delta: int, field: str) -> int:
    """Return ``current + delta`` for an ``Add`` (``current`` the stored value, None if absent).

    Raise ``ValidationError`` naming ``field`` if the stored value is not an
    integer or the sum leaves ``±MAX_COUNTER``. Backends call it inside the
    commit, before anything of the batch is written.
    """
    if current is None:
        current = 0
    if isinstance(current, bool) or not isinstance(current, int):
        raise ValidationError(field, "adds to a key whose value is not an integer")
    total = current + delta
    if not -MAX_COUNTER <= total <= MAX_COUNTER:
        raise ValidationError(field, f"the counter would leave ±{MAX_COUNTER}")
    return total


def validate_get_many(table: object, keys: object) -> list[str]:
    """Validate the arguments of ``get_many``; return the keys as a list."""
    validate_table(table)
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
        raise BadType("keys", "must be a list of keys")
    if len(keys) > MAX_GET_MANY:
        raise ValidationError("keys", f"at most {MAX_GET_MANY} keys per call")
    for i, key in enumerate(keys):
        validate_key(key, f"keys[{i}]")
    return list(keys)


def expectation_holds(entry: Entry | None, expect: Expect) -> bool:
    """Return True if ``expect`` holds for ``entry`` (``None`` means absent)."""
    if expect is ANY:
        return True
    if expect is ABSENT:
        return entry is None
    return entry is not None and entry.version == expect


def is_live(entry: Entry | None, now: int) -> bool:
    """Return True if ``entry`` exists and has not expired at ``now`` (epoch ms)."""
    return entry is not None and (entry.expires_at is None or entry.expires_at > now)


def validate_table_prefix(prefix: object) -> str:
    """Return ``prefix`` (``""`` or the start of a table name) for ``tables``; else raise."""
    if not isinstance(prefix, str):
        raise BadType("prefix", "must be a string")
    return _validate_kv_name(prefix, "prefix", forbid="{}") if prefix else prefix


def validate_import(table: object, entries: Sequence[Entry]) -> list[Entry]:
    """Validate entries for ``import_entries``; return them in key order, one per key."""
    validate_table(table)
    if isinstance(entries, (str, bytes)) or not isinstance(entries, Sequence):
        raise BadType("entries", "must be a list of Entry")
    by_key: dict[str, Entry] = {}
    for i, entry in enumerate(entries):
        where = f"entries[{i}]"
        if not isinstance(entry, Entry):
            raise BadType(where, f"{type(entry).__name__} is not an Entry")
        validate_key(entry.key, f"{where}.key")
        validate_value(entry.value, f"{where}.value")
        if isinstance(entry.version, bool) or not isinstance(entry.version, int):
            raise BadType(f"{where}.version", "must be an integer")
        if not 1 <= entry.version <= MAX_VERSION:
            raise ValidationError(f"{where}.version", f"must be between 1 and {MAX_VERSION}")
        exp = entry.expires_at
        if exp is not None and (isinstance(exp, bool) or not isinstance(exp, int) or exp < 0):
            raise ValidationError(f"{where}.expires_at", "must be epoch milliseconds or None")
        by_key[entry.key] = entry
    return [by_key[k] for k in sorted(by_key)]
