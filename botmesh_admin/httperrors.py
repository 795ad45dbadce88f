"""JSON errors on every API and webhook path, whoever produced the error.

ninja's exception handlers (``botmesh_admin.api``) render what an operation
raises. Some errors never reach an operation: Django's URL resolver (404 for a
path no route matches), ninja's own 405 ("Method not allowed", text/html), a
request Django refuses while reading it (400: a bad ``Host``, an unreadable
multipart body; 413: a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE``), and what
gunicorn refuses before Django runs at all (414: a request line over
``--limit-request-line``, 4,094 bytes by default; 431: headers over
``--limit-request-field_size``/``--limit-request-fields``).
``JsonErrorMiddleware`` turns the Django-side ones into the one error shape
``{"error": code, "message": ..., "field": ...}`` on ``/api/`` and
``/webhooks/`` paths; ``install_gunicorn_json_errors`` does the same for
gunicorn's (every path: gunicorn has not read the path when it refuses) and
``install_runserver_json_errors`` for the dev server's (``./dev run``), whose
limits are Python's ``http.server``'s: 65,536 bytes a line, 100 headers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from django.conf import settings
from django.core.exceptions import DisallowedHost, RequestDataTooBig, SuspiciousOperation
from django.http import HttpRequest, HttpResponse, JsonResponse, UnreadablePostError
from django.http.multipartparser import MultiPartParserError

log = logging.getLogger("botmesh.api")

JSON_PREFIXES = ("/api/", "/webhooks/")
"""Paths whose every answer is JSON, errors included."""

CODES = {
    400: "bad_request",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    411: "length_required",
    413: "too_large",
    414: "uri_too_long",
    431: "headers_too_large",
    500: "server_error",
}
"""The ``error`` code of an answer that carries no code of its own, by HTTP status."""

GUNICORN_REQUEST_LINE_BYTES = 4094
"""gunicorn's default ``--limit-request-line`` (bytes of ``GET /path?query HTTP/1.1``).

The cursor bound is made to fit it."""

# Headers of the original answer kept on its JSON replacement (RFC 9110 §15.5.6: a 405 names the methods).
_KEPT_HEADERS = ("Allow", "Retry-After", "WWW-Authenticate")


def error_body(status: int, message: str | None = None, *, field: str | None = None) -> dict[str, Any]:
    """Return the error shape for ``status`` (the reason phrase when no ``message`` is given)."""
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "error"
    return {"error": CODES.get(status, "http_error"), "message": message or reason.lower(), "field": field}


def too_large_body() -> dict[str, Any]:
    """Return the 413 of a request body over ``DATA_UPLOAD_MAX_MEMORY_SIZE``."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return error_body(413, f"the request body is over {limit} bytes ({limit // (1024 * 1024)} MiB); "
                      "send less at once", field="body")  # fmt: skip


def unreadable_request(exc: BaseException) -> tuple[int, dict[str, Any]] | None:
    """Return (status, body) for an exception Django raises while reading a request, else ``None``.

    ``RequestDataTooBig`` is 413; an unreadable multipart body, too many
    fields or files (``DATA_UPLOAD_MAX_NUMBER_FIELDS`` / ``_FILES``), a bad
    ``Host`` and other ``SuspiciousOperation`` are 400 (Django answers 400 too,
    in HTML).
    """
    if isinstance(exc, RequestDataTooBig):
        return 413, too_large_body()
    if isinstance(exc, MultiPartParserError):
        return 400, error_body(400, f"the multipart body cannot be read: {exc}", field="body")
    if isinstance(exc, UnreadablePostError):
        return 400, error_body(400, "the request body could not be read (the connection broke)", field="body")
    if isinstance(exc, SuspiciousOperation):
        return 400, error_body(400, str(exc) or "bad request")
    return None


def _is_json_path(request: HttpRequest) -> bool:
    return request.path.startswith(JSON_PREFIXES)


def _is_json(response: HttpResponse) -> bool:
    return str(response.get("Content-Type", "")).startswith("application/json")


PAGE_PREFIXES = ("/t/",)
"""Paths of the admin pages: an error there is a page with words, never a blank answer."""


class _PageError:
    """An error page's content (``error.html``: ``title``, ``message``, ``status``)."""

    def __init__(self, status: int, title: str, message: str) -> None:
        self.status, self.title, self.message, self.field = status, title, message, None


def _words_page(request: HttpRequest, status: int, title: str, message: str) -> HttpResponse:
    """Return the app's error page (``error.html``) saying ``title`` and what to do (``message``)."""
    from django.shortcuts import render

    return render(request, "error.html", {"error": _PageError(status, title, message)}, status=status)


def _method_not_allowed_page(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    """Return ``require_POST``'s blank 405 as a page that says what the address is for (``Allow`` kept)."""
    page = _words_page(
        request,
        405,
        "This address is a button's, not a page.",
        "It does something when its form is sent; open the page the button is on and use it there.",
    )
    if "Allow" in response:
        page["Allow"] = response["Allow"]
    return page


PROBE_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
"""Paths served whatever the ``Host`` header says: compose's healthcheck, Kubernetes' and Prometheus'
probes ask by IP (``Host: 127.0.0.1:8000``), which ``ALLOWED_HOSTS`` (the public name) refuses."""


def _probe(request: HttpRequest) -> HttpResponse:
    """Serve a probe path through its view (its own rules kept: ``/metrics``' bearer token, GET only)
    before any middleware asks ``request.get_host()``; they read no session, user or form.

    A method the probe lacks is the JSON 405 (``Allow`` kept), as ``/healthz`` and ``/readyz`` answer JSON:
    ``require_GET``'s own answer is blank ``text/html``.
    """
    from django.urls import resolve

    response: HttpResponse = resolve(request.path_info).func(request)
    if response.status_code == 405 and not response.content:
        replacement = JsonResponse(error_body(405), status=405)
        replacement["Allow"] = response["Allow"]
        return replacement
    return response


def _disallowed_host_page(request: HttpRequest) -> HttpResponse:
    """Return the app's 400 page in words for a ``Host`` not in ``ALLOWED_HOSTS`` (a page path)."""
    return _words_page(
        request,
        400,
        "This server does not answer to that name.",
        "The address's host name is not one this admin is configured for (ALLOWED_HOSTS); "
        "open it by its configured name.",
    )


class JsonErrorMiddleware:
    """Answer every 4xx/5xx on ``/api/`` and ``/webhooks/`` in the one JSON error shape; a page's blank 405 in words.

    A JSON answer passes through; any other error answer (Django's HTML 404
    and 400, ninja's text 405) is replaced by ``error_body(status)``, keeping
    ``Allow``, ``Retry-After`` and ``WWW-Authenticate``. Exceptions a view
    raises while reading the request (``unreadable_request``) become 400/413.
    A disallowed ``Host`` is refused here, before any other middleware runs (JSON on those paths, the
    app's 400 page in words elsewhere); the probe paths (``PROBE_PATHS``) are served whatever the Host.
    Put it first in ``MIDDLEWARE`` so it also sees what later middleware refuse
    (``botmesh_admin.observability.tracing`` keeps it first when it adds
    OpenTelemetry's middleware).
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path_info in PROBE_PATHS:
            return _probe(request)
        # Checked here, first: a bad Host raised in a later middleware (OpenTelemetry's calls
        # build_absolute_uri, CommonMiddleware get_host) is rendered by Django as its HTML debug page
        # when DEBUG is on, and handler400 is never asked.
        try:
            request.get_host()
        except DisallowedHost as exc:
            log.warning("%s %s refused: disallowed Host", request.method, request.path)
            if _is_json_path(request):
                return JsonResponse(error_body(400, str(exc) or "bad request", field="Host"), status=400)
            return _disallowed_host_page(request)
        response = self.get_response(request)
        if response.status_code == 405 and not response.content and request.path.startswith(PAGE_PREFIXES):
            return _method_not_allowed_page(request, response)
        if response.status_code < 400 or _is_json(response) or not _is_json_path(request):
            return response
        replacement = JsonResponse(error_body(response.status_code), status=response.status_code)
        for header in _KEPT_HEADERS:
            if header in response:
                replacement[header] = response[header]
        return replacement

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not _is_json_path(request):
            return None
        refused = unreadable_request(exception)
        if refused is None:
            return None
        log.warning("%s %s refused: %s", request.method, request.path, refused[1]["message"])
        return JsonResponse(refused[1], status=refused[0])


def bad_request(request: HttpRequest, exception: Exception, template_name: str = "400.html") -> HttpResponse:
    """``handler400``: the JSON 400 on API and webhook paths, Django's page elsewhere.

    Django renders a ``SuspiciousOperation`` (a bad ``Host`` …) raised in any
    middleware through this handler, also in middleware outside ``JsonErrorMiddleware``
    (OpenTelemetry's is inserted first at start).
    """
    if _is_json_path(request):
        status, body = unreadable_request(exception) or (400, error_body(400))
        return JsonResponse(body, status=status)
    from django.views import defaults

    return defaults.bad_request(request, exception, template_name)


def page_not_found(request: HttpRequest, exception: Exception, template_name: str = "404.html") -> HttpResponse:
    """``handler404``: the JSON 404 on API and webhook paths, the app's 404 page (``error.html``) elsewhere."""
    if _is_json_path(request):
        return JsonResponse(error_body(404), status=404)
    return _words_page(
        request, 404, "This page does not exist.", "The address may be mistyped; start again from the home page."
    )


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """``CSRF_FAILURE_VIEW``: a form sent without its CSRF token (or cookie) is the app's 403 page.

    Django's own is its debug page under ``DEBUG`` (the embedded run): this one
    says what to do, whatever the setting. ``reason`` (Django's wording) is not shown.
    """
    return _words_page(
        request,
        403,
        "This form could not be checked.",
        "It was sent without the page's security token (an old tab, or cookies blocked):"
        " reload the page and send the form again.",
    )


def server_error(request: HttpRequest, template_name: str = "500.html") -> HttpResponse:
    """``handler500``: the JSON 500 on API and webhook paths, Django's page elsewhere."""
    if _is_json_path(request):
        return JsonResponse(error_body(500, "internal server error; the error is logged"), status=500)
    from django.views import defaults

    return defaults.server_error(request, template_name)


def _gunicorn_write_error(sock: Any, status_int: int, reason: str, mesg: str) -> None:
    from gunicorn import util

    body = json.dumps(error_body(status_int, f"{reason}: {mesg}" if mesg else reason)).encode()
    head = (f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode("latin1")  # fmt: skip
    util.write_nonblock(sock, head + body)


def install_gunicorn_json_errors() -> bool:
    """Make gunicorn answer the requests it refuses itself (400, 414, 431 …) in the JSON error shape.

    gunicorn writes those through ``gunicorn.util.write_error`` (an HTML page)
    before any application code runs; this replaces that function in this
    process. Called by ``botmesh_admin.wsgi`` when gunicorn imported it.
    Return True if gunicorn is loaded (and now patched).
    """
    import sys

    util = sys.modules.get("gunicorn.util")
    if util is None:
        return False
    util.write_error = _gunicorn_write_error  # type: ignore[attr-defined]
    return True


def _runserver_send_error(handler: Any, code: int, message: str | None = None, explain: str | None = None) -> None:
    """``BaseHTTPRequestHandler.send_error`` answering in the JSON error shape (and closing, as it does)."""
    short = handler.responses.get(code, ("error", ""))[0]
    handler.log_error("code %d, message %s", code, message or short)
    handler.send_response(code, message or short)
    handler.send_header("Connection", "close")
    body = b""
    if code >= 200 and code not in (HTTPStatus.NO_CONTENT, HTTPStatus.RESET_CONTENT, HTTPStatus.NOT_MODIFIED):
        text = message or short
        body = json.dumps(error_body(code, f"{text}: {explain}" if explain else text)).encode()
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    if handler.command != "HEAD" and body:
        handler.wfile.write(body)


def install_runserver_json_errors() -> bool:
    """Make Django's dev server (``runserver``) answer what it refuses itself in the JSON error shape.

    Python's ``http.server`` under runserver refuses a request line over
    65,536 bytes (414), a header line over 65,536 bytes or over 100 headers
    (431) and an unparsable request (400) with an HTML page from
    ``send_error``; this replaces that method of Django's request handler.
    Called by ``botmesh_admin.wsgi`` (runserver loads it too). Return True if
    runserver's module is loaded (and now patched).
    """
    import sys

    basehttp = sys.modules.get("django.core.servers.basehttp")
    if basehttp is None:
        return False
    basehttp.WSGIRequestHandler.send_error = _runserver_send_error  # type: ignore[attr-defined]
    return True


__all__ = [
    "GUNICORN_REQUEST_LINE_BYTES",
    "JsonErrorMiddleware",
    "bad_request",
    "error_body",
    "install_gunicorn_json_errors",
    "install_runserver_json_errors",
    "page_not_found",
    "server_error",
    "too_large_body",
    "unreadable_request",
]
