"""Pages of a list: the limit check, the cursor check, ``limit + 1`` and ``next``.

A list reads one row more than asked: if it comes back, there is a next page,
and the cursor of the page's last row is ``next`` (pass it back as ``after``).
Cursors are opaque to clients and checked for the shape of the list's own
cursors before use (``cursor_check``): a malformed one is a ``ValidationError``
naming ``after`` (HTTP 422), a well-formed one past the end an empty page.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from botmesh_admin.errors import ValidationError

T = TypeVar("T")

MAX_PAGE = 200
"""The largest page a list page or the API gives by default (``validate_limit``'s ``maximum``)."""


def validate_limit(
    limit: object, *, field: str = "limit", maximum: int = MAX_PAGE, default: int | None = None, minimum: int = 1
) -> int:
    """Return ``limit`` if it is an int in ``minimum..maximum`` (``default`` for ``None``).

    Raise ``ValidationError`` naming ``field`` (``must be 1..200``) otherwise; a
    bool is no limit. Without ``default`` a missing limit is refused too.
    """
    if limit is None and default is not None:
        return default
    if isinstance(limit, bool) or not isinstance(limit, int) or not minimum <= limit <= maximum:
        raise ValidationError(field, f"must be {minimum}..{maximum}")
    return limit


NOT_A_CURSOR = "not a cursor of this list (pass back the previous page's next)"
"""What a list says of an ``after`` it never made (``cursor_check``, and the API for a declared shape)."""


def cursor_check(after: object, shape: re.Pattern[str]) -> str | None:
    """Return ``after`` (``None`` for none or ``""``) if it has the ``shape`` of this list's cursors.

    Raise ``ValidationError`` naming ``after`` otherwise.
    """
    if after is None or after == "":
        return None
    if not isinstance(after, str) or not shape.fullmatch(after):
        raise ValidationError("after", NOT_A_CURSOR)
    return after


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list: ``items`` and ``next``, the cursor of the following page (``None`` on the last).

    Unpacks as ``items, next = page`` (the selectors' tuple form).
    """

    items: list[T] = field(default_factory=list)
    next: str | None = None

    def __iter__(self) -> Iterator[Any]:
        return iter((self.items, self.next))


def page_of(rows: list[T], limit: int, cursor: Callable[[T], str]) -> Page[T]:
    """Return the page of ``rows`` fetched with ``limit + 1``: the first ``limit``, and ``next``.

    ``next`` is ``cursor(last item)`` when ``rows`` held more than ``limit``, else ``None``.
    """
    items = rows[:limit]
    more = len(rows) > limit
    return Page(items=items, next=cursor(items[-1]) if more and items else None)


__all__ = ["MAX_PAGE", "Page", "cursor_check", "page_of", "validate_limit"]
