"""Field checks the domain modules share: text length and characters.

Two wordings stand side by side on purpose, so no API message changes:
``json_string`` names JSON types (hub manifests, deployment specs: ``must be a
string, not number``); ``validate_text`` names Python types (CRM and campaign
fields). Both raise ``ValidationError`` naming the field path.
"""

from __future__ import annotations

import re
import unicodedata

from botmesh_admin.errors import BadType, ValidationError
from botmesh_admin.jsonbody import json_type

# C0 and C1 control characters (Unicode category Cc) except tab and line feed.
CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def json_string(value: object, path: str, *, max_len: int, blank: bool = True) -> str:
    """Return ``value`` if it is a JSON string of at most ``max_len`` characters.

    Refuse control characters other than tab and line feed and, unless
    ``blank``, a string of only white space.
    """
    if not isinstance(value, str):
        raise BadType(path, f"must be a string, not {json_type(value)}")
    if not blank and not value.strip():
        raise ValidationError(path, "must not be blank")
    if len(value) > max_len:
        raise ValidationError(path, f"longer than {max_len} characters")
    if CONTROL_RE.search(value):
        raise ValidationError(path, "contains control characters")
    return value


def validate_text(
    value: object, field: str, max_len: int, *, required: bool = False, allowed_controls: str = "\t"
) -> str:
    """Return ``value`` if it is a string of at most ``max_len`` characters.

    Refuse control characters (Unicode category Cc) not in ``allowed_controls``
    and, when ``required``, a string of only white space.
    """
    if not isinstance(value, str):
        raise BadType(field, f"must be a string, not {type(value).__name__}")
    if required and not value.strip():
        raise ValidationError(field, "must not be empty")
    if len(value) > max_len:
        raise ValidationError(field, f"longer than {max_len} characters")
    if any(unicodedata.category(ch) == "Cc" and ch not in allowed_controls for ch in value):
        raise ValidationError(field, "contains a control character")
    return value
