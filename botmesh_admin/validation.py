"""The one family of field checks for text: ``validate_text`` and the checks built on it.

Every check returns the value it accepts (``validate_name`` stripped) and
raises ``ValidationError`` naming the field path. Text refuses control
characters (those not allowed) and the invisible format characters that make
displayed text read differently from what it holds (``SPOOFING_RE``;
``spoofing_character`` names the one found). ``validate_identifier`` holds the
rules of names a store keys by (Kv tables and keys).

Two wordings stay, so no API message changes: ``json=True`` names JSON types
(hub manifests, deployment specs: ``must be a string, not number``, ``must not
be blank``); the default names Python types (CRM and campaign fields:
``must be a string, not int``, ``must not be empty``). ``json_string`` is
``validate_text(..., json=True)`` under its older name.
"""

from __future__ import annotations

import functools
import re
import unicodedata

from botmesh_admin.errors import BadType, ValidationError
from botmesh_admin.jsonbody import json_type

# C0 and C1 control characters (Unicode category Cc) except tab and line feed.
CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")

# Format characters (Unicode category Cf) that disguise what text says: the bidi embeddings,
# overrides and isolates of UAX #9 ("Trojan Source", CVE-2021-42574: "pay\u202eknil" shows as
# "paylink"), and the invisible ones that make two names look alike (UTS #39 §3.1 "Default
# Ignorable"): zero width space, word joiner and invisible operators, the deprecated format
# controls, the BOM, interlinear annotation and the language tag. Kept on purpose: ZWNJ
# U+200C and ZWJ U+200D (emoji sequences, Persian and Indic spelling), the marks LRM/RLM/ALM
# (U+200E, U+200F, U+061C: a right-to-left name with digits needs them, and they override
# nothing), the soft hyphen, Arabic number signs and the emoji tag characters U+E0020-E007F.
SPOOFING_RE = re.compile("[\u180e\u200b\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000e0001]")


def spoofing_character(value: str) -> str | None:
    """Return how a message names the first ``SPOOFING_RE`` character of ``value``, or ``None``.

    The name reads ``U+202E RIGHT-TO-LEFT OVERRIDE``.
    """
    found = SPOOFING_RE.search(value)
    if found is None:
        return None
    char = found.group()
    return f"U+{ord(char):04X} {unicodedata.name(char, 'FORMAT CHARACTER')}"


# A lone surrogate (U+D800-U+DFFF) is no character: JSON's "\ud800" escape decodes to one, and
# such a string has no UTF-8 form, so no store could keep it (RFC 8259 §8.2).
SURROGATE_RE = re.compile("[\ud800-\udfff]")


def refuse_lone_surrogate(value: str, field: str) -> None:
    """Raise ``ValidationError`` naming ``field`` if ``value`` holds a lone surrogate (``SURROGATE_RE``)."""
    found = SURROGATE_RE.search(value)
    if found:
        raise ValidationError(
            field, f"contains a lone surrogate (U+{ord(found.group()):04X}), which is not Unicode text"
        )


def ascii_digits(text: str, max_digits: int = 18) -> bool:
    """Return True if ``text`` is 1..``max_digits`` ASCII digits: what ``int(text)`` may read.

    ``str.isdigit`` alone is True for ``"²"`` (``int`` then fails) and ``"١٢"`` (Arabic-Indic digits),
    and ``int`` refuses more than 4,300 digits: an id, version or milliseconds from a client or a
    stored record is read only once this holds. 18 digits fit a signed 64-bit integer.
    """
    return text.isascii() and text.isdigit() and len(text) <= max_digits


def display_name(value: str | None, *, max_len: int = 200) -> str | None:
    """Return a name a provider sent (a WhatsApp profile name, a Telegram first name) as the admin shows it.

    Control characters (``CONTROL_RE``, tab and line feed too) and the format characters
    that disguise text (``SPOOFING_RE``: bidi overrides, zero-width space…) are removed,
    runs of white space become one space, and the result is cut to ``max_len``
    characters; ``None`` if nothing is left. A customer's name is their data, so it is
    cleaned, not refused: the message is still stored, and the inbox and the CRM (whose
    ``validate_name`` refuses those characters) get the same name.
    """
    if value is None:
        return None
    cleaned = " ".join(SPOOFING_RE.sub("", _controls_re("").sub(" ", value)).split())
    return cleaned[:max_len].rstrip() or None


def _refuse_spoofing(value: str, field: str) -> None:
    named = spoofing_character(value)
    if named:
        raise ValidationError(field, f"contains {named}, an invisible character that disguises the text")


@functools.lru_cache(maxsize=16)
def _controls_re(allowed: str) -> re.Pattern[str]:
    """Return a pattern for a control character (Unicode category Cc) not in ``allowed``."""
    bad = "".join(re.escape(chr(c)) for c in [*range(0x20), *range(0x7F, 0xA0)] if chr(c) not in allowed)
    return re.compile(f"[{bad}]")


def validate_text(
    value: object,
    field: str,
    *,
    max_len: int,
    blank: bool = False,
    allowed_controls: str | None = None,
    json: bool = False,
) -> str:
    """Return ``value`` if it is a string of at most ``max_len`` characters.

    Refuse, unless ``blank``, a string of only white space; control characters
    (Unicode category Cc) not in ``allowed_controls`` (default tab, with
    ``json`` tab and line feed); the format characters of ``SPOOFING_RE``; a
    lone surrogate (``refuse_lone_surrogate``). ``json`` words the type and
    blank errors in JSON terms (see the module). Raise ``BadType`` for a
    non-string, ``ValidationError`` naming ``field`` otherwise.
    """
    if allowed_controls is None:
        allowed_controls = "\t\n" if json else "\t"
    if not isinstance(value, str):
        kind = json_type(value) if json else type(value).__name__
        raise BadType(field, f"must be a string, not {kind}")
    if not blank and not value.strip():
        raise ValidationError(field, "must not be blank" if json else "must not be empty")
    if len(value) > max_len:
        raise ValidationError(field, f"longer than {max_len} characters")
    if _controls_re(allowed_controls).search(value):
        raise ValidationError(field, "contains control characters" if json else "contains a control character")
    _refuse_spoofing(value, field)
    refuse_lone_surrogate(value, field)
    return value


def json_string(value: object, path: str, *, max_len: int, blank: bool = True) -> str:
    """Return ``value`` if it is a JSON string of at most ``max_len`` characters (``validate_text(json=True)``).

    Blank text is allowed unless ``blank=False``; tab and line feed are the controls allowed.
    """
    return validate_text(value, path, max_len=max_len, blank=blank, json=True)


def validate_name(value: object, field: str = "name", *, max_len: int = 200, blank: bool = False) -> str:
    """Return ``value`` stripped of surrounding white space if it is a name (``validate_text``).

    A name is at most ``max_len`` characters, one line (tab allowed), not blank unless ``blank``.
    """
    return validate_text(value, field, max_len=max_len, blank=blank).strip()


MAX_IDENTIFIER_BYTES = 512


@functools.lru_cache(maxsize=8)
def _bad_identifier_chars(forbid: str) -> re.Pattern[str]:
    """Return a pattern for a character an identifier must not hold (controls, surrogates, ``forbid``).

    One search instead of a Python loop over the characters: every Kv operation
    checks its table and keys, and the loop was a good part of a commit's cost.
    """
    return re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff" + "".join(re.escape(c) for c in forbid) + "]")


def validate_identifier(value: object, field: str, *, max_bytes: int = MAX_IDENTIFIER_BYTES, forbid: str = "") -> str:
    """Return ``value`` if it is an identifier a store keys by (a Kv table name or key).

    1..``max_bytes`` UTF-8 bytes; no control character (tab included: it would
    not show), no lone surrogate (not UTF-8) and none of ``forbid``. The errors
    name the character (``contains control character U+0009``).
    """
    if not isinstance(value, str):
        raise BadType(field, f"must be a string, not {type(value).__name__}")
    if not value:
        raise ValidationError(field, "must not be empty")
    if len(value.encode("utf-8", "surrogatepass")) > max_bytes:
        raise ValidationError(field, f"longer than {max_bytes} bytes")
    bad = _bad_identifier_chars(forbid).search(value)
    if bad is not None:
        ch = bad.group()
        code = ord(ch)
        if code < 0x20 or 0x7F <= code <= 0x9F:
            raise ValidationError(field, f"contains control character U+{code:04X}")
        if 0xD800 <= code <= 0xDFFF:
            raise ValidationError(field, "contains a lone surrogate (not valid UTF-8)")
        raise ValidationError(field, f"must not contain {ch!r}")
    return value


__all__ = [
    "CONTROL_RE",
    "SPOOFING_RE",
    "json_string",
    "spoofing_character",
    "validate_identifier",
    "validate_name",
    "validate_text",
]
