"""Property: any contact the CRM can hold survives export → import unchanged (hypothesis)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from botmesh_admin.validation import SPOOFING_RE
from crm.domain import Consent, Contact, Identity, csvio, new_id


def _readable(text: str) -> bool:
    """Whether ``text`` holds none of the invisible characters every write refuses (``SPOOFING_RE``)."""
    return SPOOFING_RE.search(text) is None


names = st.one_of(
    st.none(),
    st.sampled_from(["=1+2", "'=x", "'quoted", "+57", "-5", "@sum", "a;b", 'say "hi"', "Ana García"]),
    st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=30)
    .map(str.strip)
    .filter(bool)
    .filter(_readable),
)
attr_names = st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True).filter(lambda n: n not in csvio.RESERVED)
attr_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53) + 1, 2**53 - 1),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=20).filter(_readable),
)
tags = st.lists(st.from_regex(r"[a-z0-9][a-z0-9 _-]{0,8}[a-z0-9]", fullmatch=True), max_size=4)


@st.composite
def contacts(draw) -> Contact:
    n = draw(st.integers(1, 10**9))
    c = Contact(
        id=new_id("c"),
        name=draw(names),
        identities=(Identity("telegram", str(n)),),
        tags=tuple(sorted(set(" ".join(t.split()) for t in draw(tags)))),
        attributes=draw(st.dictionaries(attr_names, attr_values, max_size=4)),
    )
    status = draw(st.sampled_from(["granted", "denied", "unknown"]))
    return c.with_consent(Consent("telegram", status, 1, "test")) if status != "unknown" else c


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(contacts(), min_size=1, max_size=5, unique_by=lambda c: c.identities))
def test_exported_rows_parse_back_to_the_same_values(items: list[Contact]) -> None:
    columns = csvio.export_columns(items)
    text = "".join(csvio.format_csv([columns, *(csvio.export_row(columns, c) for c in items)]))
    header, rows = csvio.read_rows(text)
    assert header.errors == []
    parsed = [csvio.parse_row(header, cells, number, "CO") for number, cells in rows]
    for contact, row in zip(items, parsed, strict=True):
        assert not isinstance(row, list), row
        assert row.name == contact.name
        assert row.identities == list(contact.identities)
        assert row.tags == contact.tags
        assert row.attributes == dict(contact.attributes)
        assert all(type(row.attributes[k]) is type(v) for k, v in contact.attributes.items())
        expected = {ch: c.status for ch, c in contact.consent.items()}
        assert row.consent == expected
