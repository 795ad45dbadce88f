"""Inbound webhooks: verify, parse, journal, then answer (ARCHITECTURE §6-7).

- ``GET  /webhooks/whatsapp/<tenant>`` — Meta's subscription handshake.
- ``POST /webhooks/whatsapp/<tenant>`` — signed with ``X-Hub-Signature-256``.
- ``POST /webhooks/telegram/<tenant>/<name>`` — with ``X-Telegram-Bot-Api-Secret-Token``.

A POST is durable before it is answered: one journal envelope per raw body
(``whatsapp.webhook`` / ``telegram.update`` on the ``inbound`` channel, payload
``{"config": <channel name(s)>, "events": [event.to_dict(), ...]}``, each event
naming the ``channel_name`` that received it) is appended,
idempotent by the SHA-256 of the raw body (WhatsApp) or the ``update_id``
(Telegram), so a provider's redelivery is journaled once. If the journal cannot
be written the view answers 503 and the provider retries. Projection into
the inbox happens in a worker.

Answers: 200 once journaled (``{"received": n, "event_id": …}``, with ``"skipped": k`` when
k messages or statuses were left out because the inbox can never store their ids); 401
(nothing written) for a bad signature or secret; 404 for an unknown tenant or channel; 400 for a body that is not a JSON
object; 413 (JSON) for a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (16 MiB).
Order: the signature is checked before the body is parsed, so unauthenticated
input is never interpreted.

A store outage — the journal, or the database holding the channel
configuration, cannot be reached — is the JSON 503 ``store_unavailable`` with
``Retry-After`` (never Django's HTML 500): Meta and Telegram retry it, and the
redelivery is journaled once when the store is back.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Callable
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods
from opentelemetry import trace

from botmesh_admin.errors import DomainError, ValidationError, retry_after_s, store_unavailable
from botmesh_admin.jsonbody import json_load_object
from botmesh_admin.observability.tracing import server_span

from . import selectors, telegram, whatsapp
from .domain import Channel, InboundEvent

log = logging.getLogger("botmesh.channels")

INBOUND_CHANNEL = "inbound"


def _error(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"error": code, "message": message, "field": None}, status=status)


def _journal(tenant: str, type_: str, key: str, config: str, events: list[InboundEvent]) -> str:
    from botmesh_admin.events.services import event_publish
    from botmesh_admin.observability.tracing import inject_context

    # Journaled before the HTTP answer; the drain is queued after commit. The
    # trace context (the request's ``server_span``) travels in the payload so
    # the projection continues this trace.
    record = event_publish(
        tenant,
        type=type_,
        channel=INBOUND_CHANNEL,
        payload={"config": config, "events": [e.to_dict() for e in events], "trace": inject_context()},
        idempotency_key=key,
    )
    current = trace.get_current_span()  # the request's span: authenticated now, so filed under the tenant
    if current.is_recording():
        current.set_attributes({"botmesh.tenant": tenant, "botmesh.event_type": type_, "botmesh.events": len(events)})
    return str(record.id)


def _storable(kind: str, tenant: str, events: list[InboundEvent]) -> tuple[list[InboundEvent], int]:
    """Return ``(the events the inbox can store, how many were skipped)``.

    An event whose ids the inbox can never store (``inbox.domain.inbound_event_problem``:
    a message id or sender over 200 characters or with ``/``…) would fail
    projection on every attempt and end a dead letter no replay fixes. It is
    skipped with a log line — the parsers' rule for a message without a usable
    ``from``/``id`` — and the others are journaled: refusing the body instead
    would make Meta (and Telegram) redeliver it, good messages included, for days.
    """
    from inbox.domain import inbound_event_problem

    kept: list[InboundEvent] = []
    for event in events:
        problem = inbound_event_problem(event)
        if problem is None:
            kept.append(event)
        else:
            log.warning("%s webhook for tenant %s: %s skipped, never storable: %s", kind, tenant, event.kind, problem)
    return kept, len(events) - len(kept)


def _answer(events: list[InboundEvent], skipped: int, event_id: str) -> JsonResponse:
    body: dict[str, Any] = {"received": len(events), "event_id": event_id}
    if skipped:
        body["skipped"] = skipped
    return JsonResponse(body)


def _json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        return json_load_object(raw, field="body")
    except ValidationError:  # invalid, not UTF-8, nested too deeply, not an object
        return None


def _domain_error_response(exc: DomainError) -> JsonResponse:
    response = JsonResponse(exc.as_dict(), status=exc.status)
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


# Answers that may come from a stale per-process copy of the configuration (a
# channel or secret just set in another process): checked again against the database.
RECHECK = (401, 403, 404)


@csrf_exempt
@require_http_methods(["GET", "POST"])
@server_span
@_domain_errors
def whatsapp_webhook(request: HttpRequest, tenant: str) -> HttpResponse:
    """Answer Meta's handshake (GET) or journal a signed webhook body (POST)."""
    cached = selectors.channel_config_list_cached(tenant, kind="whatsapp")
    response = _whatsapp(request, tenant, cached)
    if response.status_code in RECHECK:
        fresh = selectors.channel_config_list_cached(tenant, kind="whatsapp", refresh=True)
        response = _whatsapp(request, tenant, fresh)
    if response.status_code == 401:
        log.warning("whatsapp webhook for tenant %s: bad signature", tenant)
    return response


def _whatsapp(request: HttpRequest, tenant: str, channels: list[Channel]) -> HttpResponse:
    """Answer a WhatsApp webhook request against ``channels``; journal only what is answered 200."""
    if not channels:
        return _error(404, "not_found", "no WhatsApp channel here")
    if request.method == "GET":
        challenge = whatsapp.verify_handshake(
            request.GET, lambda token: any(c.check("verify_token", token) for c in channels)
        )
        if challenge is None:
            return _error(403, "forbidden", "verification failed")
        return HttpResponse(challenge, content_type="text/plain")

    raw = request.body
    header = request.headers.get(whatsapp.SIGNATURE_HEADER)
    signed_by = {
        c.phone_number_id
        for c in channels
        if c.is_set("app_secret") and whatsapp.verify_signature(raw, header, c.secret("app_secret") or "")
    }
    if not signed_by:
        if not header:
            return _error(401, "bad_signature", f"{whatsapp.SIGNATURE_HEADER} is missing")
        return _error(401, "bad_signature", f"{whatsapp.SIGNATURE_HEADER} does not match the body")
    body = _json_object(raw)
    if body is None:
        return _error(400, "bad_request", "the body is not a JSON object")
    names = []
    by_number = {c.phone_number_id: c for c in channels}
    for phone_number_id in whatsapp.phone_number_ids(body):
        channel = by_number.get(phone_number_id)
        if channel is None:
            return _error(404, "not_found", f"no WhatsApp channel for phone number id {phone_number_id!r}")
        if phone_number_id not in signed_by:  # signed with another number's app secret
            return _error(401, "bad_signature", "the body is not signed with this number's app secret")
        names.append(channel.name)
    if not names:  # a change without metadata (an account-level field): name the signing channel(s)
        names = [c.name for c in channels if c.phone_number_id in signed_by]
    # Each change's events belong to the channel of its own phone_number_id.
    events = whatsapp.parse_webhook(body, {pid: c.name for pid, c in by_number.items() if pid and pid in signed_by})
    events, skipped = _storable("whatsapp", tenant, events)
    key = "whatsapp:" + hashlib.sha256(raw).hexdigest()
    event_id = _journal(tenant, "whatsapp.webhook", key, ",".join(names), events)
    log.info("whatsapp webhook for tenant %s: %d events journaled as %s", tenant, len(events), event_id)
    return _answer(events, skipped, event_id)


@csrf_exempt
@require_http_methods(["POST"])
@server_span
@_domain_errors
def telegram_webhook(request: HttpRequest, tenant: str, name: str) -> HttpResponse:
    """Journal a Telegram ``Update`` sent with the channel's secret token."""
    cached = selectors.channel_config_list_cached(tenant, kind="telegram")
    response = _telegram(request, tenant, name, cached)
    if response.status_code in RECHECK:
        fresh = selectors.channel_config_list_cached(tenant, kind="telegram", refresh=True)
        response = _telegram(request, tenant, name, fresh)
    if response.status_code == 401:
        log.warning("telegram webhook for tenant %s channel %s: bad secret token", tenant, name)
    return response


def _telegram(request: HttpRequest, tenant: str, name: str, channels: list[Channel]) -> HttpResponse:
    """Answer a Telegram webhook request against ``channels``; journal only what is answered 200."""
    channel = next((c for c in channels if c.name == name), None)
    if channel is None:
        return _error(404, "not_found", f"Telegram channel {name!r} not found")
    if not channel.check("webhook_secret", request.headers.get(telegram.SECRET_HEADER)):
        if not request.headers.get(telegram.SECRET_HEADER):
            return _error(401, "bad_secret", f"{telegram.SECRET_HEADER} is missing")
        return _error(401, "bad_secret", f"{telegram.SECRET_HEADER} does not match")
    update = _json_object(request.body)
    update_id = telegram.update_id(update)
    if update is None or update_id is None:
        return _error(400, "bad_request", "the body is not a Telegram Update")
    try:
        events = telegram.parse_update(update, channel_name=channel.name)
    except ValidationError as exc:
        return _error(400, "bad_request", exc.message)
    events, skipped = _storable("telegram", tenant, events)
    event_id = _journal(tenant, "telegram.update", f"telegram:{name}:{update_id}", name, events)
    log.info("telegram update for tenant %s channel %s: %d events journaled as %s", tenant, name, len(events), event_id)
    return _answer(events, skipped, event_id)
