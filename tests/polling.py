"""Waiting for what another process or thread does, in the tests that run real ones."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], object], what: str, timeout_s: float = 30.0, interval_s: float = 0.05) -> None:
    """Call ``predicate`` every ``interval_s`` seconds until it is true; fail the test after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)
