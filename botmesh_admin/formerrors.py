"""A refused form, shown the one way every page shows it: what was typed kept, the error next to its field.

A service refuses bad input with a ``DomainError`` whose ``field`` is the
domain's path (``reply.text``, ``segment.rules.attributes``, ``crontab``) and
whose message starts with that path (``reply.text: must not be blank``) — right
for the API, wrong for a person. A view that catches it builds a ``FormError``
with ``form_error(exc, form=…, fields=…, typed=request.POST)`` (the domain path
mapped to the form's input name, the problem in plain words) and renders its
page again, status 422, with ``form_error`` in the context. Templates show it
with the builtin tags of this module (``settings.TEMPLATES`` ``builtins``)::

    <textarea name="text"{% field_invalid "text" form="reply" %}>{% typed "text" form="reply" %}</textarea>
    {% field_error "text" form="reply" %}
    {% form_error_box form="reply" %}   {# an error of the form as a whole, or of a field it has no input for #}

A form with several inputs checks them all first, so the person sees every
mistake at once, not one per submission: ``check_all(lambda: validate_name(…),
lambda: …)`` runs each check and raises one ``FieldErrors`` holding every
``ValidationError``; ``form_error`` of it puts each under its input (the
tags above show each); nothing is written when any is wrong.

``form`` tells several forms of one page apart (the reply box and the note box
both have ``text``); a page with one form may leave it out.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from botmesh_admin.errors import DomainError, ValidationError

register = template.Library()


@dataclasses.dataclass(frozen=True)
class FormError:
    """One refused submission: ``form`` (which form of the page), ``field`` (its input name, ``None``:
    the form as a whole), ``message`` (plain words, no code, no status, no domain path) and
    ``typed`` (the submitted values, shown again)."""

    form: str
    field: str | None
    message: str
    typed: Mapping[str, str] = dataclasses.field(default_factory=dict)
    status: int = 422
    others: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """The errors of further inputs (input name → plain message) when several were wrong at once."""

    def message_of(self, name: str) -> str | None:
        """Return the error of input ``name`` (plain words), or ``None``."""
        return self.message if self.field == name else self.others.get(name)


class FieldErrors(ValidationError):
    """Several fields refused at once (``check_all``): ``errors``, in the order of the checks.

    Its own ``field`` and message are the first error's, so an API caller sees one
    ordinary 422; ``form_error`` shows every one under its input.
    """

    def __init__(self, errors: list[ValidationError]) -> None:
        first = errors[0]
        super().__init__(first.field or "", first.problem)
        self.errors = errors


def check_all(*checks: Callable[[], object]) -> None:
    """Run every check (a callable that raises ``ValidationError`` on bad input) and refuse them all at once.

    Raise ``FieldErrors`` holding each ``ValidationError`` raised, in order, when any is; other
    errors propagate at once. A form validates each field with this before it writes anything.
    """
    errors: list[ValidationError] = []
    for check in checks:
        try:
            check()
        except FieldErrors as exc:
            errors.extend(exc.errors)
        except ValidationError as exc:
            errors.append(exc)
    if errors:
        raise FieldErrors(errors)


def plain(text: str, *, capitalize: bool = True) -> str:
    """Return ``text`` as a sentence: first letter upper case (unless not ``capitalize``), a full stop at the end."""
    text = text.strip()
    if not text:
        return text
    if capitalize:
        text = text[0].upper() + text[1:]
    return text if text[-1] in ".!?…)" else text + "."


def _input_for(path: str | None, fields: Mapping[str, str]) -> tuple[str | None, str]:
    """Return (the input name for domain ``path``, what is left of the path after it).

    ``fields`` maps a domain path (``reply.text``) or an input name to the input
    name; the longest key that is ``path`` or a prefix of it (followed by ``.``
    or ``[``) wins.
    """
    if not path:
        return None, ""
    best: tuple[str | None, str] = (None, "")
    best_len = -1
    for key, name in fields.items():
        if (path == key or path.startswith(key + ".") or path.startswith(key + "[")) and len(key) > best_len:
            best, best_len = (name, path[len(key) :].lstrip(".")), len(key)
    return best


_INDEX_RE = re.compile(r"\[(\d+)\]")


def _where(rest: str, unit: str = "item") -> str:
    """Say the tail of a field path in words: ``[0]`` → ``item 1``, ``[2].address`` → ``item 3, address``.

    ``unit`` ``line``: the index is a line of a text area (``[1]`` → ``line 2``)."""
    words = _INDEX_RE.sub(lambda m: f" {unit} {int(m.group(1)) + 1}, ", rest)
    return ", ".join(part.strip(" .") for part in words.split(",") if part.strip(" ."))


def form_error(
    exc: DomainError,
    *,
    form: str = "",
    fields: Mapping[str, str] | Iterable[str] = (),
    typed: Mapping[str, Any] | None = None,
    lines: Iterable[str] = (),
) -> FormError:
    """Return ``exc`` as a ``FormError`` of ``form``.

    ``fields``: the form's inputs, as names (``["crontab", "every_s"]``) or as a
    mapping from the domain path to the input name (``{"reply.text": "text"}``).
    A ``ValidationError`` on one of them becomes that input's error, in the
    problem's own words (``Must not be blank.``; a deeper path keeps its tail:
    ``plan: must be ….``, ``Item 2: …``); any other error (or a field the form has no input for)
    is the form's error, its message without the domain path.
    ``typed``: the submitted values (``request.POST``); only strings are kept.
    ``lines``: the inputs (text areas) whose item index is a line number: ``Line 2: …``.
    A ``FieldErrors`` (``check_all``) shows every error: each input's errors under it, one after
    the other; those no input takes in the form's box.
    """
    mapping = dict(fields) if isinstance(fields, Mapping) else {name: name for name in fields}
    values = {k: v for k, v in (typed or {}).items() if isinstance(v, str)}
    if isinstance(exc, FieldErrors):
        # Every input's first error under it; errors no input takes go to the form's box, together.
        each = [form_error(e, form=form, fields=mapping, typed=values, lines=lines) for e in exc.errors]
        by_input: dict[str, str] = {}
        for one in each:
            if one.field is not None:
                by_input[one.field] = f"{by_input[one.field]} {one.message}" if one.field in by_input else one.message
        loose = " ".join(one.message for one in each if one.field is None)
        if loose:
            return FormError(form, None, loose, values, exc.status, others=by_input)
        first = next(iter(by_input))
        return FormError(form, first, by_input.pop(first), values, exc.status, others=by_input)
    if isinstance(exc, ValidationError):
        name, rest = _input_for(exc.field, mapping)
        problem = exc.problem
        if name is not None:
            where = _where(rest, "line" if name in set(lines) else "item")
            # A tail names the user's own key (``plan``): kept as typed, not capitalised.
            numbered = where.startswith(("item", "line"))
            message = plain(f"{where}: {problem}", capitalize=numbered) if where else plain(problem)
            return FormError(form, name, message, values, exc.status)
        return FormError(form, None, plain(problem), values, exc.status)
    return FormError(form, None, plain(exc.message), values, exc.status)


def _current(context: template.Context, form: str | None) -> FormError | None:
    error = context.get("form_error")
    if not isinstance(error, FormError):
        return None
    if form is not None and error.form != form:
        return None
    return error


def _error_id(form: str | None, name: str) -> str:
    return f"{form}-{name}-error" if form else f"{name}-error"


ERROR_TITLES = {
    400: "That address is not one this page understands.",
    403: "Your role does not allow this.",
    404: "Not found.",
    409: "Someone changed this meanwhile.",
    413: "That is too large.",
    422: "Not done:",
    429: "Too many attempts.",
    503: "A store is unavailable; try again in a moment.",
}
"""The heading of an error page or box by HTTP status: words, never the status and the API's code."""


ERROR_TITLES[405] = "This address is a button's, not a page."

# "contact bogus not found", "plugin 'x.y' is not installed", "job 'x' is not declared", "page not found".
_NOT_FOUND_RE = re.compile(r"^(?P<what>[a-z][a-z ]{0,30}?)(?: \S+)? (?:not found|is not installed|is not declared)$")
# principal.require: "this action needs the admin role in tenant 'tienda'".
_ROLE_RE = re.compile(r"^this action needs the (?P<role>\w+) role in tenant '(?P<tenant>[^']+)'$")


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def _plain_words(error: object) -> tuple[str, str] | None:
    """Return (heading, text) of a not-found or a role refusal as a person reads it, else ``None``.

    "contact bogus not found" → "This contact does not exist."; "this action needs the admin role in
    tenant 'tienda'" → "Only an admin of tienda can do this.".
    """
    if not isinstance(error, DomainError) or getattr(error, "title", None):
        return None
    message = str(error.message)
    if error.status == 404:
        found = _NOT_FOUND_RE.match(message)
        what = found.group("what") if found else None
        if what and len(what.split()) <= 3:
            return f"This {what} does not exist.", "It may have been deleted, or the address is mistyped."
    if error.status == 403:
        role = _ROLE_RE.match(message)
        if role:
            who, tenant = role.group("role"), role.group("tenant")
            return (
                f"Only {_article(who)} {who} of {tenant} can do this.",
                f"Ask an admin of {tenant} to do it, or to give you the {who} role.",
            )
    return None


@register.filter
def error_title(error: object) -> str:
    """Return the heading of ``error`` (a ``DomainError`` or anything with ``title`` / ``status``)."""
    title = getattr(error, "title", None)
    if title:
        return str(title)
    words = _plain_words(error)
    if words:
        return words[0]
    return ERROR_TITLES.get(int(getattr(error, "status", 400) or 400), "Something went wrong.")


@register.filter
def error_text(error: object) -> str:
    """Return what went wrong in plain words: a ``ValidationError`` as ``Snooze hours: not a number.``.

    The field is named by its last part in words, not by the API's path (``conversation.snooze_hours``);
    a not-found or a role refusal says what to do (``_plain_words``).
    """
    words = _plain_words(error)
    if words:
        return words[1]
    if isinstance(error, ValidationError) and error.field:
        name = _INDEX_RE.sub("", error.field).rsplit(".", 1)[-1].replace("_", " ").strip()
        return plain(f"{name}: {error.problem}" if name else error.problem)
    message = str(getattr(error, "message", error))
    field = getattr(error, "field", None)
    # A message that starts with an address parameter (``state: must be one of …``) keeps its exact spelling.
    return plain(message, capitalize=not (field and message.startswith(field)))


@register.simple_tag(takes_context=True)
def field_error(context: template.Context, name: str, form: str | None = None) -> SafeString:
    """Render the error of input ``name`` (``<p class="field-error" role="alert">``), or nothing."""
    error = _current(context, form)
    message = error.message_of(name) if error is not None else None
    if message is None:
        return mark_safe("")
    return format_html(
        '<p class="field-error" id="{}" role="alert" data-testid="field-error">{}</p>',
        _error_id(form, name),
        message,
    )


@register.simple_tag(takes_context=True)
def field_invalid(context: template.Context, name: str, form: str | None = None) -> SafeString:
    """Render `` aria-invalid="true" aria-describedby="…"`` on input ``name`` when it is the one at fault."""
    error = _current(context, form)
    if error is None or error.message_of(name) is None:
        return mark_safe("")
    return format_html(' aria-invalid="true" aria-describedby="{}"', _error_id(form, name))


@register.simple_tag(takes_context=True)
def form_error_box(context: template.Context, form: str | None = None) -> SafeString:
    """Render an error of the form as a whole (no input of the form takes it), or nothing."""
    error = _current(context, form)
    if error is None or error.field is not None:
        return mark_safe("")
    return format_html('<div class="error-box" role="alert" data-testid="form-error">{}</div>', error.message)


@register.simple_tag(takes_context=True)
def typed(context: template.Context, name: str, form: str | None = None, default: object = "") -> str:
    """Return what was typed into input ``name`` of the refused ``form`` (escaped by the template), else ``default``."""
    error = _current(context, form)
    if error is not None and name in error.typed:
        return error.typed[name]
    return "" if default is None else str(default)
