"""A refused form in plain words, mapped from the domain's field path to the form's input (issue 20 item 6)."""

from __future__ import annotations

import pytest
from django.template import Context, Template

from botmesh_admin.errors import Conflict, ValidationError
from botmesh_admin.formerrors import FieldErrors, check_all, form_error


def test_a_domain_path_becomes_the_input_and_a_plain_sentence() -> None:
    refused = form_error(
        ValidationError("reply.text", "must not be blank"), form="reply", fields={"reply.text": "text"}, typed={}
    )
    assert (refused.form, refused.field, refused.message) == ("reply", "text", "Must not be blank.")
    tags = form_error(ValidationError("segment.rules.tags_all[1]", "not a tag"), fields={"segment.rules.tags_all": "t"})
    assert (tags.field, tags.message) == ("t", "Item 2: not a tag.")
    attr = form_error(
        ValidationError("segment.rules.attributes.plan", "must be a number"),
        fields={"segment.rules.attributes": "attributes"},
    )
    assert attr.message == "plan: must be a number."  # the key as typed


def test_an_error_no_input_owns_is_the_forms_own_without_code_or_path() -> None:
    other = form_error(ValidationError("segment", "at most 3 segments"), form="segment", fields=["name"])
    assert other.field is None and other.message == "At most 3 segments."
    conflict = form_error(Conflict("someone saved this meanwhile"), form="segment", fields=["name"])
    assert conflict.field is None and conflict.status == 409 and conflict.message == "Someone saved this meanwhile."


TEMPLATE = Template(
    '<textarea name="text"{% field_invalid "text" form="reply" %}>{% typed "text" form="reply" %}</textarea>'
    '{% field_error "text" form="reply" %}|'
    '<input value="{% typed "text" form="note" %}">{% field_error "text" form="note" %}'
    "{% form_error_box form='reply' %}"
)


def test_the_tags_show_the_typed_text_and_the_error_on_its_own_form_only() -> None:
    refused = form_error(
        ValidationError("reply.text", "contains U+202E"),
        form="reply",
        fields={"reply.text": "text"},
        typed={"text": "Hola <b>\u202e"},
    )
    html = TEMPLATE.render(Context({"form_error": refused}))
    reply, note = html.split("|")
    assert reply == (
        '<textarea name="text" aria-invalid="true" aria-describedby="reply-text-error">Hola &lt;b&gt;\u202e</textarea>'
        '<p class="field-error" id="reply-text-error" role="alert" data-testid="field-error">Contains U+202E.</p>'
    )
    assert note == '<input value="">'  # the note box is another form: untouched
    assert TEMPLATE.render(Context({})) == '<textarea name="text"></textarea>|<input value="">'


def test_an_error_box_says_it_in_words_never_status_code_and_path() -> None:
    from botmesh_admin.errors import NotFound

    box = Template('{% include "_error.html" %}')
    html = box.render(Context({"error": ValidationError("conversation.snooze_hours", "not a number")}))
    assert html.strip() == (
        '<div class="error-box" role="alert"><strong>Not done:</strong> Snooze hours: not a number.</div>'
    )
    assert "This conversation does not exist.</strong> It may have been deleted" in box.render(
        Context({"error": NotFound("conversation cv_1 not found")})
    )


def test_check_all_refuses_every_bad_field_at_once_each_under_its_input() -> None:
    """Every check runs; each input shows its own first error; one no input takes goes to the box."""

    def bad(field: str, problem: str):
        def check() -> None:
            raise ValidationError(field, problem)

        return check

    try:
        check_all(bad("c.name", "must not be empty"), lambda: "fine", bad("c.rate", "not a number"), bad("c.rate", "x"))
    except FieldErrors as exc:
        assert [e.field for e in exc.errors] == ["c.name", "c.rate", "c.rate"] and exc.field == "c.name"
        refused = form_error(exc, form="c", fields={"c.name": "name", "c.rate": "rate"}, typed={"rate": "fast!"})
    else:
        raise AssertionError("check_all refused nothing")
    page = Template(
        '{% field_error "name" form="c" %}{% field_error "rate" form="c" %}<input{% field_invalid "rate" form="c" %}>'
    )
    html = page.render(Context({"form_error": refused}))
    assert 'id="c-name-error" role="alert" data-testid="field-error">Must not be empty.<' in html
    assert 'id="c-rate-error" role="alert" data-testid="field-error">Not a number. X.<' in html
    assert '<input aria-invalid="true" aria-describedby="c-rate-error">' in html
    with_loose = form_error(
        FieldErrors([ValidationError("c.name", "empty"), ValidationError("c.other", "bad")]), fields={"c.name": "name"}
    )
    assert (with_loose.field, with_loose.message, with_loose.message_of("name")) == (None, "Bad.", "Empty.")
    check_all(lambda: None)  # nothing wrong: nothing raised


@pytest.mark.parametrize(
    ("error", "heading"),
    [
        ("contact bogus not found", "This contact does not exist."),
        ("plugin 'acme.nope' is not installed", "This plugin does not exist."),
        ("job 'x' is not declared", "This job does not exist."),
        ("page not found", "This page does not exist."),
    ],
)
def test_a_not_found_page_says_what_does_not_exist(error: str, heading: str) -> None:
    from botmesh_admin.errors import NotFound

    html = Template('{% include "_error.html" %}').render(Context({"error": NotFound(error)}))
    assert f"<strong>{heading}</strong>" in html and "not_found" not in html, html


def test_a_role_refusal_says_who_may() -> None:
    from botmesh_admin.errors import PermissionDenied

    refused = PermissionDenied("this action needs the admin role in tenant 'tienda'")
    html = Template('{% include "_error.html" %}').render(Context({"error": refused}))
    assert "<strong>Only an admin of tienda can do this.</strong>" in html, html
    assert "permission_denied" not in html
