"""Pagination helpers: the limit check, ``limit + 1`` into a page with ``next``, the cursor check."""

from __future__ import annotations

import re

import pytest

from botmesh_admin import cursors
from botmesh_admin.errors import ValidationError
from botmesh_admin.pagination import Page, cursor_check, page_of, validate_limit


def test_validate_limit_accepts_the_range_and_names_the_field() -> None:
    assert validate_limit(1) == 1
    assert validate_limit(200) == 200
    assert validate_limit(None, default=50) == 50
    assert validate_limit(0, minimum=0) == 0
    for bad in (0, 201, "10", 2.0, True, None):
        with pytest.raises(ValidationError) as caught:
            validate_limit(bad)
        assert caught.value.field == "limit"
        assert caught.value.problem == "must be 1..200"
    with pytest.raises(ValidationError) as caught:
        validate_limit(10_001, field="query.limit", maximum=10_000)
    assert (caught.value.field, caught.value.problem) == ("query.limit", "must be 1..10000")


def test_page_of_trims_the_extra_row_and_sets_next() -> None:
    rows = ["a", "b", "c", "d"]
    page = page_of(rows, 3, cursor=str.upper)
    assert page == Page(items=["a", "b", "c"], next="C")
    items, nxt = page
    assert (items, nxt) == (["a", "b", "c"], "C")
    assert page_of(rows[:3], 3, cursor=str.upper) == Page(items=["a", "b", "c"], next=None)
    assert page_of([], 3, cursor=str.upper) == Page(items=[], next=None)
    assert page_of(["a"], 0, cursor=str.upper) == Page(items=[], next=None)


def test_cursor_check_moved_with_a_reexport() -> None:
    shape = re.compile(r"c_[0-9a-f]{4}")
    assert cursors.cursor_check is cursor_check
    assert cursor_check("c_00ff", shape) == "c_00ff"
    assert cursor_check("", shape) is None
    assert cursor_check(None, shape) is None
    with pytest.raises(ValidationError) as caught:
        cursor_check("c_zz", shape)
    assert caught.value.field == "after"
