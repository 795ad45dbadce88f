"""Field checks the domain modules share: text length and characters.

Two wordings stand side by side on purpose, so no API message changes:
``json_string`` names JSON types (hub manifests, deployment specs: ``must be a
string, not number``); ``validate_text`` names Python types (CRM and campaign
fields). Both raise ``ValidationError`` naming the field path.

Both also refuse the invisible format characters that make displayed text read
differently from what it holds (``SPOOFING_RE``); ``spoofing_character`` names
the one found.
"""

from __future__ import annotations

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


def _refuse_spoofing(value: str, field: str) -> None:
    named = spoofing_character(value)
    if named:
        raise ValidationError(field, f"contains {named}, an invisible character that disguises the text")


def json_string(value: object, path: str, *, max_len: int, blank: bool = True) -> str:
    """Return ``value`` if it is a JSON string of at most ``max_len`` characters.

    Refuse control characters other than tab and line feed, the format
    characters of ``SPOOFING_RE`` and, unless ``blank``, a string of only white space.
    """
    if not isinstance(value, str):
        raise BadType(path, f"must be a string, not {json_type(value)}")
    if not blank and not value.strip():
        raise ValidationError(path, "must not be blank")
    if len(value) > max_len:
        raise ValidationError(path, f"longer than {max_len} characters")
    if CONTROL_RE.search(value):
        raise ValidationError(path, "contains control characters")
    _refuse_spoofing(value, path)
    return value


def validate_text(
    value: object, field: str, max_len: int, *, required: bool = False, allowed_controls: str = "\t"
) -> str:
    """Return ``value`` if it is a string of at most ``max_len`` characters.

    Refuse control characters (Unicode category Cc) not in ``allowed_controls``,
    the format characters of ``SPOOFING_RE`` and, when ``required``, a string of
    only white space.
    """
    if not isinstance(value, str):
        raise BadType(field, f"must be a string, not {type(value).__name__}")
    if required and not value.strip():
        raise ValidationError(field, "must not be empty")
    if len(value) > max_len:
        raise ValidationError(field, f"longer than {max_len} characters")
    if any(unicodedata.category(ch) == "Cc" and ch not in allowed_controls for ch in value):
        raise ValidationError(field, "contains a control character")
    _refuse_spoofing(value, field)
    return value
