"""The CSV format of contact import and export (no storage here: parse and format only).

Columns (header names are case-insensitive; order is free):

=====================  ======================================================
``name``               display name
``phone``              WhatsApp phone(s), ``;``-separated; read in the tenant's region
``email``              email address(es), ``;``-separated
``telegram_id``        Telegram user id(s), ``;``-separated
``tags``               tags separated by ``;`` (or ``,``)
``marketing_consent``  ``granted`` / ``denied`` / ``unknown`` for every channel of the row
``consent_<channel>``  the same for one channel (wins over ``marketing_consent``)
``<attribute>``        any other column is a string attribute (empty cell: not set)
``<attribute>:json``   a JSON literal: string, number, boolean or null
=====================  ======================================================

Rows are numbered as a spreadsheet shows them: the header is row 1, the first
contact row 2. Export writes the same columns, so an exported file imports back
to the same contacts (``:json`` columns keep numbers, booleans and null exact).
"""

from __future__ import annotations

import codecs
import csv
import io
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from botmesh_admin.errors import ValidationError, bounded
from botmesh_admin.jsonbody import json_load
from crm.domain import (
    ATTRIBUTE_NAME_RE,
    CHANNELS,
    CONSENT_STATUSES,
    AttributeValue,
    Contact,
    Identity,
    normalize_identity,
    normalize_tags,
    validate_attribute_value,
    validate_name,
)

IDENTITY_COLUMNS = {
    "phone": "whatsapp",
    "whatsapp": "whatsapp",
    "email": "email",
    "telegram_id": "telegram",
    "telegram": "telegram",
}
CONSENT_COLUMNS = {f"consent_{ch}": ch for ch in CHANNELS}
RESERVED = {"name", "tags", "marketing_consent", "id", *IDENTITY_COLUMNS, *CONSENT_COLUMNS}
MAX_BYTES = 20 * 1024 * 1024
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
# Byte order marks of the encodings read besides UTF-8 (the Unicode Standard, §23.8).
BOMS = (
    (codecs.BOM_UTF8, "utf-8", "UTF-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le", "UTF-16"),
    (codecs.BOM_UTF16_BE, "utf-16-be", "UTF-16"),
)
ZIP_MAGIC = b"PK\x03\x04"  # .xlsx and .ods are zip archives


@dataclass
class RowError:
    """One problem in one row; ``row`` as a spreadsheet numbers it (header = 1)."""

    row: int
    field: str | None
    message: str

    def to_json(self) -> dict[str, Any]:
        """Return the report's form; ``field`` and ``message`` cut to 200 characters (``bounded``): a column
        name is the client's text, and a 20,000-character header came back whole in every report."""
        field = None if self.field is None else bounded(self.field)
        return {"row": self.row, "field": field, "message": bounded(self.message, 500)}


@dataclass
class ParsedRow:
    """A validated row, ready to be merged into the CRM."""

    row: int
    name: str | None = None
    identities: list[Identity] = field(default_factory=list)
    tags: tuple[str, ...] = ()
    attributes: dict[str, AttributeValue] = field(default_factory=dict)
    consent: dict[str, str] = field(default_factory=dict)  # channel -> status


def decode(data: bytes | str) -> str:
    """Return the text of an uploaded file; raise ``ValidationError`` (field ``file``) if it is not text.

    Accepted: UTF-8 with or without BOM; UTF-16 (LE or BE) with its BOM, which is
    what Excel writes for "Unicode Text"; else Windows-1252 (Excel's "CSV" on a
    Western Windows). A file that is none of these -- invalid after its BOM,
    UTF-16 without a BOM, a workbook, any file with NUL characters -- is refused
    here, before a job exists, with the encoding it was read as.
    """
    if isinstance(data, str):
        return _text_only(data, "text")
    if len(data) > MAX_BYTES:
        raise ValidationError("file", f"larger than {MAX_BYTES // (1024 * 1024)} MB")
    if data.startswith(ZIP_MAGIC):
        raise ValidationError(
            "file",
            'is a spreadsheet workbook (.xlsx/.ods), not CSV: save it as "CSV UTF-8" or "Unicode Text" and upload that',
        )
    for bom, encoding, label in BOMS:
        if data.startswith(bom):
            try:
                return _text_only(data[len(bom) :].decode(encoding), label)
            except UnicodeDecodeError as exc:
                raise ValidationError(
                    "file",
                    f"starts with a {label} byte order mark but is not valid {label} "
                    f"(byte {exc.start} of the text after it)",
                ) from None
    try:
        return _text_only(data.decode("utf-8"), "UTF-8")
    except UnicodeDecodeError:
        pass
    try:
        return _text_only(data.decode("cp1252"), "Windows-1252")
    except UnicodeDecodeError as exc:
        raise ValidationError(
            "file",
            f"is neither UTF-8 nor Windows-1252 text (byte 0x{data[exc.start]:02X} at offset "
            f'{exc.start}); save it as "CSV UTF-8" or as UTF-16 with a byte order mark',
        ) from None


def _text_only(text: str, label: str) -> str:
    # A NUL never occurs in a text CSV; it does in UTF-16 read without its BOM
    # (every ASCII letter is followed by 0x00, which is valid UTF-8) and in binary files.
    at = text.find("\x00")
    if at >= 0:
        raise ValidationError(
            "file",
            f"read as {label}, it holds a NUL character (at character {at}): not a text CSV "
            "(UTF-16 needs its byte order mark)",
        )
    return text


def _reader(text: str) -> Iterator[list[str]]:
    first = text.split("\n", 1)[0]
    delimiter = max(",;\t", key=first.count) if first else ","
    return csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)


@dataclass
class Header:
    """The columns of a file: which index holds what; ``errors`` name bad column names."""

    columns: list[tuple[int, str, str]]  # (index, kind, name) kind: name/identity/tags/consent/attr/json
    errors: list[RowError]
    width: int  # cells in the header row; a row with values beyond it is refused


def parse_header(cells: list[str]) -> Header:
    """Classify the header cells; unknown attribute names are reported on row 1 and ignored.

    Raise ``ValidationError`` on ``file`` when a known column appears twice (``name,phone,phone``) or
    none of the columns is a known one (``foo,bar,baz``: every row would fail): refused at upload.
    """
    columns: list[tuple[int, str, str]] = []
    errors: list[RowError] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(cells):
        name = raw.strip().lower()
        if name in RESERVED and name in seen:
            # Which of the two cells would a row's value be? Neither: the file is refused, naming it.
            raise ValidationError(
                "file",
                f"the column {name} appears twice (columns {seen[name] + 1} and {index + 1}); keep one of them",
            )
        seen.setdefault(name, index)
        if not name or name == "id":
            continue
        if name == "name":
            columns.append((index, "name", name))
        elif name in IDENTITY_COLUMNS:
            columns.append((index, "identity", name))
        elif name == "tags":
            columns.append((index, "tags", name))
        elif name == "marketing_consent" or name in CONSENT_COLUMNS:
            columns.append((index, "consent", name))
        else:
            attr, _, kind = name.partition(":")
            if not ATTRIBUTE_NAME_RE.fullmatch(attr) or kind not in ("", "json"):
                errors.append(
                    RowError(
                        1,
                        raw.strip(),
                        "not a column name: attribute columns match "
                        "^[a-z][a-z0-9_]{0,63}$, optionally with the suffix :json",
                    )
                )
                continue
            columns.append((index, "json" if kind else "attr", attr))
    named = [raw.strip() for raw in cells if raw.strip()]
    if named and not any(name.strip().lower() in RESERVED for name in named):
        # Every row would fail "no phone, email or telegram_id": likely not a contacts file (or no header row).
        raise ValidationError(
            "file",
            f"none of the columns {', '.join(named[:10])}{', …' if len(named) > 10 else ''} is known; "
            f"expected name, phone, email, telegram_id, tags, marketing_consent, consent_<channel> "
            f"(other columns are attributes beside them)",
        )
    return Header(columns, errors, len(cells))


def _unescape(text: str) -> str:
    # Export prefixes cells that start like a spreadsheet formula (or with "'") with "'"
    # (OWASP "CSV injection"); take it off again.
    if len(text) > 1 and text[0] == "'" and text[1] in (*FORMULA_START, "'"):
        return text[1:]
    return text


def parse_row(header: Header, cells: list[str], row: int, default_region: str) -> ParsedRow | list[RowError]:
    """Return the validated row, or every error found in it (the row is then skipped).

    A row with a value past the header's last column is refused whole (field
    ``None``, naming both column counts): its values would otherwise land under
    no column and be lost. Empty trailing cells are no error.
    """
    if any(c.strip() for c in cells[header.width :]):
        return [
            RowError(
                row,
                None,
                f"the row has {len(cells)} columns but the header has {header.width}; "
                f"the values after column {header.width} have no column name",
            )
        ]
    out = ParsedRow(row)
    errors: list[RowError] = []
    general_consent: str | None = None
    for index, kind, name in header.columns:
        cell = _unescape(cells[index].strip()) if index < len(cells) else ""
        if not cell:
            continue
        try:
            if kind == "name":
                out.name = validate_name(cell, name)
            elif kind == "identity":
                channel = IDENTITY_COLUMNS[name]
                for part in (p.strip() for p in cell.split(";")):
                    if part:
                        ident = Identity(channel, normalize_identity(channel, part, default_region, field=name))
                        if ident not in out.identities:
                            out.identities.append(ident)
            elif kind == "tags":
                out.tags = normalize_tags([t for t in cell.replace(",", ";").split(";") if t.strip()], name)
            elif kind == "consent":
                status = cell.lower()
                if status not in CONSENT_STATUSES:
                    raise ValidationError(
                        name, f"unknown consent value {cell[:20]!r}; use {', '.join(CONSENT_STATUSES)}"
                    )
                if name == "marketing_consent":
                    general_consent = status
                else:
                    out.consent[CONSENT_COLUMNS[name]] = status
            elif kind == "attr":
                out.attributes[name] = validate_attribute_value(cell, name)
            else:
                value = json_load(cell, field=f"{name}:json")
                out.attributes[name] = validate_attribute_value(value, f"{name}:json")
        except ValidationError as exc:
            errors.append(RowError(row, exc.field, exc.problem))
    if not out.identities and not any(e.field in IDENTITY_COLUMNS for e in errors):
        errors.append(RowError(row, "phone", "the row has no phone, email or telegram_id"))
    if errors:
        return errors
    if general_consent is not None:
        for channel in dict.fromkeys(i.channel for i in out.identities):
            out.consent.setdefault(channel, general_consent)
    return out


def read_rows(text: str) -> tuple[Header, Iterator[tuple[int, list[str]]]]:
    """Return the header and an iterator of ``(row number, cells)``; blank lines are skipped."""
    reader = _reader(text)
    try:
        header = parse_header(next(reader))
    except StopIteration:
        raise ValidationError("file", "the file is empty (no header row)") from None

    def rows() -> Iterator[tuple[int, list[str]]]:
        for number, cells in enumerate(reader, start=2):
            if any(c.strip() for c in cells):
                yield number, cells

    return header, rows()


def count_rows(text: str) -> int:
    """Return the number of non-blank data rows of ``text``."""
    return sum(1 for _ in read_rows(text)[1])


# --------------------------------------------------------------------------- export


def _escape(text: str) -> str:
    return "'" + text if text.startswith((*FORMULA_START, "'")) else text


def export_columns(contacts: Iterable[Contact]) -> list[str]:
    """Return the header for ``contacts``: fixed columns, then one column per attribute.

    An attribute whose values are all strings gets a plain column; any other
    gets a ``:json`` column so its type survives the round trip.
    """
    kinds: dict[str, bool] = {}
    for contact in contacts:
        for name, value in contact.attributes.items():
            plain = isinstance(value, str) and value == value.strip() != "" and value[0] != "'"
            kinds[name] = kinds.get(name, True) and plain
    fixed = ["name", "phone", "email", "telegram_id", "tags", *CONSENT_COLUMNS]
    return fixed + [name if plain else f"{name}:json" for name, plain in sorted(kinds.items())]


def export_row(columns: list[str], contact: Contact) -> list[str]:
    """Return the cells of ``contact`` under ``columns``."""
    cells: list[str] = []
    for column in columns:
        if column == "name":
            cells.append(_escape(contact.name or ""))
        elif column in ("phone", "email", "telegram_id"):
            cells.append(";".join(contact.addresses(IDENTITY_COLUMNS[column])))
        elif column == "tags":
            cells.append(_escape(";".join(contact.tags)))
        elif column in CONSENT_COLUMNS:
            status = contact.consent_status(CONSENT_COLUMNS[column])
            cells.append("" if status == "unknown" else status)
        elif column.endswith(":json"):
            name = column[: -len(":json")]
            cells.append(json.dumps(contact.attributes[name], ensure_ascii=False) if name in contact.attributes else "")
        else:
            value = contact.attributes.get(column)
            cells.append(_escape(value) if isinstance(value, str) else "")
    return cells


def format_csv(rows: Iterable[list[str]]) -> Iterator[str]:
    """Yield CSV text, one line per row (RFC 4180 quoting, ``\\r\\n`` line ends)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    for row in rows:
        writer.writerow(row)
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()


def as_mapping(row: ParsedRow) -> Mapping[str, Any]:
    """Return the row as a plain dict (for tests and debugging)."""
    return {
        "row": row.row,
        "name": row.name,
        "identities": [i.key for i in row.identities],
        "tags": list(row.tags),
        "attributes": row.attributes,
        "consent": row.consent,
    }
