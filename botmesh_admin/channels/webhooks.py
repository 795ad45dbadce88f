"""Inbound webhooks over HTTP: read the request, call the acceptance service, map its answer (ARCHITECTURE §6-7).

- ``GET  /webhooks/whatsapp/<tenant>`` — Meta's subscription handshake.
- ``POST /webhooks/whatsapp/<tenant>`` — signed with ``X-Hub-Signature-256``.
- ``POST /webhooks/telegram/<tenant>/<name>`` — with ``X-Telegram-Bot-Api-Secret-Token``.

Which channel a request is for, whose secret signed it and the journal envelope
are decided in ``channels.services.webhooks``; a POST is durable (journaled)
before it is answered, and projection into the inbox happens in a worker.

Answers: 200 once journaled (``{"received": n, "event_id": …}``, with ``"skipped": k`` when
k messages or statuses were left out: the inbox can never store their ids, or they lack one); 401
(nothing written) for a bad signature or secret; 404 for an unknown tenant or channel; 400 for a body that is not a JSON
object; 413 (JSON) for a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (16 MiB).

A store outage — the journal, or the database holding the channel
configuration, cannot be reached — is the JSON 503 ``store_unavailable`` with
``Retry-After`` (never Django's HTML 500): Meta and Telegram retry it, and the
redelivery is journaled once when the store is back.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from botmesh_admin.errors import DomainError, retry_after_s, store_unavailable
from botmesh_admin.observability.tracing import server_span

from . import services, telegram, whatsapp
from .services import WebhookAccepted, WebhookRefused

log = logging.getLogger("botmesh.channels")


def _error(status: int, code: str, message: str, field: str | None = None) -> JsonResponse:
    return JsonResponse({"error": code, "message": message, "field": field}, status=status)


def _answer(accepted: WebhookAccepted) -> JsonResponse:
    body: dict[str, Any] = {"received": len(accepted.events), "event_id": accepted.event_id}
    if accepted.skipped:
        body["skipped"] = accepted.skipped
    return JsonResponse(body)


def _refused(exc: WebhookRefused) -> JsonResponse:
    return _error(exc.status, exc.code, exc.message, exc.field)


def _domain_error_response(exc: DomainError) -> JsonResponse:
    response = JsonResponse(exc.to_json(), status=exc.status)
    retry = retry_after_s(exc)
    if retry is not None:
        response["Retry-After"] = str(max(1, round(retry)))
    return response


def _domain_errors(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Render a ``DomainError`` (say, an unreadable credential: 503) in the API's error shape.

    A store outage from any layer (our ``StoreUnavailable``, or the Django
    database's ``OperationalError`` / ``InterfaceError`` from the configuration
    lookup) is the JSON 503 ``store_unavailable`` with ``Retry-After``.
    """

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        kind = request.path.split("/")[2]
        try:
            return view(request, *args, **kwargs)
        except RequestDataTooBig:
            from botmesh_admin.api import too_large

            log.warning("webhook %s refused: body over the size limit", kind)
            return too_large(request)
        except DomainError as exc:
            log.error("webhook %s failed: %s: %s", kind, exc.code, exc.message)
            return _domain_error_response(exc)
        except Exception as exc:
            unavailable = store_unavailable(exc)
            if unavailable is None:
                raise
            log.error("webhook %s failed: %s (%s: %s)", kind, unavailable.code, type(exc).__name__, exc)
            return _domain_error_response(unavailable)

    return wrapper


@csrf_exempt
@require_http_methods(["GET", "POST"])
@server_span
@_domain_errors
def whatsapp_webhook(request: HttpRequest, tenant: str) -> HttpResponse:
    """Answer Meta's handshake (GET) or journal a signed webhook body (POST)."""
    try:
        if request.method == "GET":
            challenge = services.webhook_whatsapp_handshake(tenant, params=request.GET)
            return HttpResponse(challenge, content_type="text/plain")
        accepted = services.webhook_whatsapp_accept(
            tenant, read_body=lambda: request.body, signature=request.headers.get(whatsapp.SIGNATURE_HEADER)
        )
    except WebhookRefused as exc:
        if exc.status == 401:
            log.warning("whatsapp webhook for tenant %s: bad signature", tenant)
        return _refused(exc)
    return _answer(accepted)


@csrf_exempt
@require_http_methods(["POST"])
@server_span
@_domain_errors
def telegram_webhook(request: HttpRequest, tenant: str, name: str) -> HttpResponse:
    """Journal a Telegram ``Update`` sent with the channel's secret token."""
    try:
        accepted = services.webhook_telegram_accept(
            tenant, name=name, read_body=lambda: request.body, secret=request.headers.get(telegram.SECRET_HEADER)
        )
    except WebhookRefused as exc:
        if exc.status == 401:
            log.warning("telegram webhook for tenant %s channel %s: bad secret token", tenant, name)
        return _refused(exc)
    return _answer(accepted)
