"""Cursors of paginated lists: opaque to clients, checked for shape before use.

Every list returns ``next`` (pass it back as ``after`` for the following page).
A cursor is whatever the list orders by: an id, a sort key, an index key. A
store compares it with its keys as a string, so any text "works" — and a
mistyped cursor used to return the first page again, an empty page or a store
error depending on the list. Each selector checks ``after`` against the shape
of the cursors its list makes, so that every list answers alike: a malformed
cursor is a ``ValidationError`` naming ``after`` (HTTP 422), and a well-formed
one past the end an empty page.
"""

from __future__ import annotations

# ``cursor_check`` lives in botmesh_admin.pagination with the rest of a page's checks.
from botmesh_admin.pagination import cursor_check

__all__ = ["cursor_check"]
