"""Destructive page actions ask first, with or without JavaScript (one pattern for every delete and revoke).

The page's button is a POST form carrying htmx's ``hx-confirm`` (a browser
dialog) and ``hx-vals`` ``{"confirm": "yes"}``: with JavaScript the user answers
the dialog and the action runs; without it the form posts without
``confirm`` and the view answers ``confirm_page`` — what will happen, a button
that posts again with ``confirm=yes``, and Cancel. After the action the view
answers ``done`` (a redirect; for htmx an ``HX-Redirect``, so the browser loads
the list page with its message rather than swapping it into the form).
"""

from __future__ import annotations

from collections.abc import Sequence

from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render

CONFIRM_FIELD = "confirm"


def confirmed(request: HttpRequest) -> bool:
    """Return True if the POST says the user confirmed (``confirm=yes``, from the dialog or the confirm page)."""
    return request.method == "POST" and request.POST.get(CONFIRM_FIELD) == "yes"


def confirm_page(
    request: HttpRequest,
    *,
    question: str,
    consequences: Sequence[str] = (),
    button: str,
    cancel_url: str,
    refusal: str | None = None,
) -> HttpResponse:
    """Render the page that asks ``question`` before a destructive action (posts back to this URL).

    ``consequences`` are sentences of what happens; with ``refusal`` (why the
    action cannot be done now) the page shows it instead of the button.
    """
    return render(
        request,
        "confirm.html",
        {
            "question": question,
            "consequences": consequences,
            "button": button,
            "cancel_url": cancel_url,
            "refusal": refusal,
            "action_url": request.get_full_path(),
        },
    )


def done(request: HttpRequest, url: str) -> HttpResponse:
    """Redirect to ``url`` after the action: ``HX-Redirect`` for an htmx request, else a 302."""
    if request.headers.get("HX-Request"):
        response = HttpResponse(status=204)
        response["HX-Redirect"] = url
        return response
    return HttpResponseRedirect(url)
