"""Helpers shared by the serialising backends (FileKv, SqlKv, RedisKv).

Values are stored as compact JSON text. Key ranges are computed in code point
order, which for valid UTF-8 is the same as byte order: the order PostgreSQL's
``COLLATE "C"``, SQLite's ``BINARY`` collation and Redis ``ZRANGEBYLEX`` use.
"""

from __future__ import annotations

import json
from typing import Any

_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dump_value(value: Any) -> str:
    """Return ``value`` (already validated as plain JSON) as compact JSON text."""
    return _encoder.encode(value)


def load_value(text: str | bytes) -> Any:
    """Return the JSON value stored as ``text``."""
    return json.loads(text)


def prefix_end(prefix: str) -> str | None:
    """Return the least string greater than every string starting with ``prefix``.

    Return ``None`` when there is no such bound (empty prefix, or a prefix made
    only of U+10FFFF). Scans use ``prefix <= key < prefix_end(prefix)`` so an
    index range stops at the end of the prefix instead of filtering the rest.
    """
    chars = list(prefix)
    while chars:
        code = ord(chars.pop())
        if code < 0x10FFFF:
            code += 1
            if code == 0xD800:  # surrogates never occur in keys (validated); skip them
                code = 0xE000
            return "".join(chars) + chr(code)
    return None


def scan_start(prefix: str, after: str | None) -> tuple[str, bool]:
    """Return ``(start, inclusive)``: where a scan for ``prefix``/``after`` begins."""
    if after is not None and after >= prefix:
        return after, False
    return prefix, True
