"""Parse untrusted JSON (request bodies, uploaded files) into a ``ValidationError`` or a value.

Every JSON body the project reads goes through ``json_load`` (or
``json_load_object``) so that no input can answer 500. ``json.loads`` alone
is not enough: for input nested deeper than the interpreter's recursion limit
it raises ``RecursionError``, which is not a ``ValueError``; and a value nested
just under that limit parses, then exhausts the stack later when it is
validated or encoded again. So nesting is capped at ``MAX_DEPTH``, far below
the limit and far above any payload the project accepts (a WhatsApp webhook
nests 7 levels deep).

NaN and Infinity are refused: they are not JSON (RFC 8259 §6) and a
PostgreSQL ``jsonb`` column would refuse them later.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from botmesh_admin.errors import BadType, ValidationError

MAX_DEPTH = 64


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def json_load(
    raw: bytes | bytearray | str,
    *,
    field: str,
    max_bytes: int | None = None,
    reject_duplicate_keys: bool = False,
) -> Any:
    """Return the JSON value of untrusted ``raw``; raise ``ValidationError`` naming ``field``.

    Refuse more than ``max_bytes`` bytes, bytes that are not UTF-8, invalid
    JSON, NaN/Infinity, nesting deeper than ``MAX_DEPTH`` and, when
    ``reject_duplicate_keys``, an object repeating a key (``field.<key>``).
    """
    return _load(raw, field, max_bytes, reject_duplicate_keys, "valid JSON")


def _load(
    raw: bytes | bytearray | str,
    field: str,
    max_bytes: int | None,
    reject_duplicate_keys: bool,
    wanted: str,
) -> Any:
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if not isinstance(data, bytes | bytearray):
        raise BadType(field, f"must be JSON bytes or text, not {type(raw).__name__}")
    if max_bytes is not None and len(data) > max_bytes:
        raise ValidationError(field, f"body larger than {max_bytes} bytes")
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        raise ValidationError(field, f"not {wanted}: the body is not UTF-8") from None
    hook: Callable[[list[tuple[str, Any]]], Any] | None = _reject_duplicates if reject_duplicate_keys else None
    try:
        value = json.loads(text, object_pairs_hook=hook, parse_constant=_reject_constant)
    except _DuplicateKey as exc:
        raise ValidationError(f"{field}.{exc.key}", "duplicate key") from None
    except RecursionError:
        raise ValidationError(field, f"not {wanted}: nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as exc:
        if "integer string conversion" in str(exc):  # Python's own cap on the digits of an int
            raise ValidationError(field, f"not {wanted}: a number has more than 4300 digits") from None
        raise ValidationError(field, f"not {wanted}: invalid JSON ({exc})") from None
    if _depth_exceeds(value, MAX_DEPTH):
        raise ValidationError(field, f"not {wanted}: nested more than {MAX_DEPTH} levels deep")
    return value


def json_load_object(
    raw: bytes | bytearray | str,
    *,
    field: str,
    max_bytes: int | None = None,
    reject_duplicate_keys: bool = False,
) -> dict[str, Any]:
    """Return the JSON object of untrusted ``raw`` (see ``json_load``); anything else is a ``ValidationError``."""
    value = _load(raw, field, max_bytes, reject_duplicate_keys, "a JSON object")
    if not isinstance(value, dict):
        raise ValidationError(field, f"not a JSON object (got {json_type(value)})")
    return value


def json_type(value: Any) -> str:
    """Return the JSON name of a parsed value's type (``object``, ``array``, ``number``…)."""
    if value is None:
        return "null"
    return {
        bool: "boolean",
        int: "number",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
    }.get(type(value), type(value).__name__)


def _depth_exceeds(value: Any, limit: int) -> bool:
    # Iterative on purpose: recursing here would hit the very limit this guards.
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


__all__ = ["MAX_DEPTH", "json_load", "json_load_object", "json_type"]
