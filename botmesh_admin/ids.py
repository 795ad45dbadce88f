"""Ids the domain modules mint: time-ordered record ids and newest-first audit ids."""

from __future__ import annotations

import itertools
import os
import re
import secrets
import threading

from botmesh_admin.clock import now_ms

_id_lock = threading.Lock()
_id_last = [0, 0]  # last ms, sequence inside it

AUDIT_EPOCH_END = 10**15  # epoch ms far in the future; audit ids count down from it
_audit_counter = itertools.count()


def new_id(prefix: str) -> str:
    """Return a new id that sorts by creation time: prefix, ``_``, 22 hex digits.

    12 hex of epoch ms, 4 of a per-process sequence (ids made by one process in
    one millisecond keep their order), 6 random.
    """
    with _id_lock:
        ms = now_ms()
        if ms <= _id_last[0]:
            ms, seq = _id_last[0], _id_last[1] + 1
            if seq > 0xFFFF:
                ms, seq = ms + 1, 0
        else:
            seq = 0
        _id_last[:] = [ms, seq]
    return f"{prefix}_{ms:012x}{seq:04x}{os.urandom(3).hex()}"


_ID_TAIL = re.compile(r"_[0-9a-f]{22}")


def is_id(value: object, prefix: str) -> bool:
    """Return True if ``value`` has the shape of an id ``new_id(prefix)`` mints (``c_`` + 22 hex digits).

    A store answers "not found" for anything else without reading (an address
    such as ``contacts/x%00y`` holds no Kv key), so it is a 404, never a 422 of a key.
    """
    return isinstance(value, str) and value.startswith(prefix) and bool(_ID_TAIL.fullmatch(value, len(prefix)))


def new_audit_id(at: int) -> str:
    """Return an audit id that sorts newest first.

    Inverted epoch ms, then an inverted per-process counter (events of one
    process within one millisecond keep their order), then a random tiebreak
    that keeps ids of different processes distinct.
    """
    return f"{AUDIT_EPOCH_END - at:015d}-{10**12 - 1 - next(_audit_counter) % 10**12:012d}-{secrets.token_hex(3)}"
