"""Read a ``Transfer-Encoding: chunked`` request body, or refuse it — never read it as empty.

Django sizes every request body by ``CONTENT_LENGTH`` alone (``WSGIRequest``
wraps ``wsgi.input`` in a ``LimitedStream`` of that many bytes, 0 when the
header is absent), and a chunked request has no ``Content-Length`` (RFC 9112
§6.1: Transfer-Encoding overrides it). So a chunked webhook was verified
against an empty body (401 bad_signature), a chunked ``POST …/contacts`` had
no body (422) and a 17 MB chunked body was never refused as too large.

``ChunkedBodyMiddleware`` reads such a body itself when the server has
de-chunked it: gunicorn sets ``wsgi.input_terminated`` (the WSGI extension
werkzeug and gunicorn agreed on: ``wsgi.input`` ends at the end of the body,
so reading it to EOF is safe). It reads at most ``DATA_UPLOAD_MAX_MEMORY_SIZE``
bytes (16 MiB; 413 beyond, without reading the rest) and hands Django the
bytes with their length. A server that does not de-chunk (``manage.py
runserver``, wsgiref) would hand over the raw chunk framing or nothing: 411
Length Required. On ``/api/`` and ``/webhooks/`` both answers are the JSON
error shape (``botmesh_admin.httperrors``).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable

from django.conf import settings
from django.core.handlers.wsgi import LimitedStream
from django.http import HttpRequest, HttpResponse, JsonResponse

from botmesh_admin.httperrors import JSON_PREFIXES, error_body, too_large_body

log = logging.getLogger("botmesh.api")

READ_BYTES = 64 * 1024
"""Bytes asked of ``wsgi.input`` per read while buffering a chunked body."""


def _refuse(request: HttpRequest, status: int, body: dict[str, object]) -> HttpResponse:
    log.warning("%s %s refused: %s", request.method, request.path, body["message"])
    if request.path.startswith(JSON_PREFIXES):
        return JsonResponse(body, status=status)
    return HttpResponse(str(body["message"]), status=status, content_type="text/plain; charset=utf-8")


class ChunkedBodyMiddleware:
    """Give Django the body of a request sent with ``Transfer-Encoding``, or answer 411/413/400.

    - the server de-chunked it (``wsgi.input_terminated``, gunicorn): read up to
      ``DATA_UPLOAD_MAX_MEMORY_SIZE`` bytes and set ``CONTENT_LENGTH`` to what was
      read; over that, 413 ``too_large`` (field ``body``);
    - otherwise (runserver): 411 ``length_required`` (field ``body``);
    - the server's de-chunker fails (a malformed chunk, the connection broke): 400.

    Put it right after ``JsonErrorMiddleware``, before anything reads the body.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.META.get("HTTP_TRANSFER_ENCODING"):
            return self.get_response(request)
        if not request.META.get("wsgi.input_terminated"):
            return _refuse(request, 411, error_body(
                411, "this server cannot read a chunked request body (Transfer-Encoding); "
                "send Content-Length, or run behind gunicorn", field="body"))  # fmt: skip
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        stream = request.META["wsgi.input"]
        data = bytearray()
        try:
            # One byte past the limit tells "over" from "exactly at"; the rest is never read.
            while limit is None or len(data) <= limit:
                want = READ_BYTES if limit is None else min(READ_BYTES, limit + 1 - len(data))
                chunk = stream.read(want)
                if not chunk:
                    break
                data += chunk
        except Exception as exc:  # gunicorn raises its own ParseException classes, not OSError only
            return _refuse(request, 400, error_body(
                400, f"the chunked request body could not be read ({type(exc).__name__})", field="body"))  # fmt: skip
        if limit is not None and len(data) > limit:
            return _refuse(request, 413, too_large_body())
        request.META["CONTENT_LENGTH"] = str(len(data))
        # WSGIRequest sized its stream from CONTENT_LENGTH when it was built (0 here); body,
        # POST and FILES all read this stream, so it is replaced by the buffered bytes.
        request._stream = LimitedStream(io.BytesIO(bytes(data)), len(data))  # type: ignore[attr-defined]
        return self.get_response(request)


__all__ = ["READ_BYTES", "ChunkedBodyMiddleware"]
