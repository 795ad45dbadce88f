"""Webhook acceptance: which channel a request is for, whose secret signed it, then the journal (ARCHITECTURE §6-7).

The HTTP views (``channels.webhooks``) only read the request and map what these
functions return or raise to an answer; every rule of acceptance lives here:

- WhatsApp (Cloud API): the body must carry a valid ``X-Hub-Signature-256``
  (HMAC-SHA256 of the raw body with an app secret) of a WhatsApp channel of the
  tenant; every change's ``metadata.phone_number_id`` must be a configured
  number *and* signed with that number's own app secret (a body signed with
  another number's secret is refused: one Meta app may not speak for another).
- Telegram (Bot API): ``X-Telegram-Bot-Api-Secret-Token`` must match the named
  channel's ``webhook_secret``.

The signature is checked before the body is parsed, so unauthenticated input is
never interpreted. A refusal is checked again against the database (the
per-process configuration copy may miss a channel or secret just set in another
process) before it is final.

An accepted body is durable before it is answered: one journal envelope per raw
body (``whatsapp.webhook`` / ``telegram.update`` on the ``inbound`` channel,
payload ``{"config": <channel name(s)>, "events": [event.to_json(), ...]}``),
idempotent by the SHA-256 of the raw body (WhatsApp) or the ``update_id``
(Telegram), so a provider's redelivery is journaled once.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from opentelemetry import trace

from botmesh_admin.errors import DomainError, ValidationError
from botmesh_admin.jsonbody import json_load_object

from .. import selectors, telegram, whatsapp
from ..domain import Channel, InboundEvent

log = logging.getLogger("botmesh.channels")

INBOUND_CHANNEL = "inbound"

T = TypeVar("T")


class WebhookRefused(DomainError):
    """A webhook request the tenant's channels do not accept; nothing was written.

    ``status``/``code``: 400 ``bad_request`` (not a JSON object / not a Telegram
    Update), 401 ``bad_signature`` (WhatsApp) or ``bad_secret`` (Telegram),
    403 ``forbidden`` (the subscription handshake failed), 404 ``not_found``
    (no such channel or phone number id). ``field`` names the part of the body
    refused, when one is (a Telegram Update's ``message.date``), else ``None``.
    """

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message, field=field)
        self.status = status
        self.code = code


# Refusals that may come from a stale per-process copy of the configuration.
RECHECK = (401, 403, 404)


@dataclass(frozen=True)
class WebhookAccepted:
    """A journaled webhook body: the events kept, how many were skipped (never storable), the journal event id."""

    events: list[InboundEvent]
    skipped: int
    event_id: str


def _checked(tenant: str, kind: str, accept: Callable[[list[Channel]], T]) -> T:
    """Run ``accept`` on the cached channels of ``kind``; a stale-looking refusal runs it again on fresh ones."""
    try:
        return accept(selectors.channel_config_list_cached(tenant, kind=kind))
    except WebhookRefused as exc:
        if exc.status not in RECHECK:
            raise
    return accept(selectors.channel_config_list_cached(tenant, kind=kind, refresh=True))


def webhook_whatsapp_handshake(tenant: str, *, params: Mapping[str, str]) -> str:
    """Return the ``hub.challenge`` to echo for Meta's subscription handshake (GET).

    Raises ``WebhookRefused`` 404 (no WhatsApp channel in ``tenant``) or 403
    (not a subscribe request, or ``hub.verify_token`` matches no channel's verify token).
    """

    def accept(channels: list[Channel]) -> str:
        if not channels:
            raise WebhookRefused(404, "not_found", "no WhatsApp channel here")
        challenge = whatsapp.verify_handshake(
            params, lambda token: any(c.check("verify_token", token) for c in channels)
        )
        if challenge is None:
            raise WebhookRefused(403, "forbidden", "verification failed")
        return challenge

    return _checked(tenant, "whatsapp", accept)


def webhook_whatsapp_accept(tenant: str, *, read_body: Callable[[], bytes], signature: str | None) -> WebhookAccepted:
    """Accept a WhatsApp Cloud API webhook body (raw bytes from ``read_body()``) signed with ``signature``.

    ``signature`` is the ``X-Hub-Signature-256`` header. The body is read only once a channel
    could accept it (``read_body`` may raise the transport's too-large error).

    Returns the journaled ``WebhookAccepted``. Raises ``WebhookRefused``: 404 no
    WhatsApp channel in ``tenant`` / a change for a phone number id no channel
    has; 401 ``bad_signature`` signature missing, matching no channel's app
    secret, or made with another number's app secret; 400 the body is not a
    JSON object. ``StoreUnavailable`` (or the database's error) when the journal
    or the configuration cannot be read.
    """
    names, events, body, unusable = _checked(
        tenant, "whatsapp", lambda channels: _whatsapp_accept(channels, read_body, signature)
    )
    events, skipped = _storable("whatsapp", tenant, events, unusable)
    key = "whatsapp:" + hashlib.sha256(body).hexdigest()
    event_id = _journal(tenant, "whatsapp.webhook", key, ",".join(names), events)
    log.debug("whatsapp webhook for tenant %s: %d events journaled as %s", tenant, len(events), event_id)
    return WebhookAccepted(events, skipped, event_id)


def _whatsapp_accept(
    channels: list[Channel], read_body: Callable[[], bytes], header: str | None
) -> tuple[list[str], list[InboundEvent], bytes, list[str]]:
    """Return ``(names of the channels the body is for, its events, the raw body, what the parser skipped)``.

    Raise ``WebhookRefused`` when the body is refused.
    """
    if not channels:
        raise WebhookRefused(404, "not_found", "no WhatsApp channel here")
    raw = read_body()
    signed_by = {
        c.phone_number_id
        for c in channels
        if c.is_set("app_secret") and whatsapp.verify_signature(raw, header, c.secret("app_secret") or "")
    }
    if not signed_by:
        if not header:
            raise WebhookRefused(401, "bad_signature", f"{whatsapp.SIGNATURE_HEADER} is missing")
        raise WebhookRefused(401, "bad_signature", f"{whatsapp.SIGNATURE_HEADER} does not match the body")
    body = _json_object(raw)
    if body is None:
        raise WebhookRefused(400, "bad_request", "the body is not a JSON object")
    names = []
    by_number = {c.phone_number_id: c for c in channels}
    for phone_number_id in whatsapp.phone_number_ids(body):
        channel = by_number.get(phone_number_id)
        if channel is None:
            raise WebhookRefused(404, "not_found", f"no WhatsApp channel for phone number id {phone_number_id!r}")
        if phone_number_id not in signed_by:  # signed with another number's app secret
            raise WebhookRefused(401, "bad_signature", "the body is not signed with this number's app secret")
        names.append(channel.name)
    if not names:  # a change without metadata (an account-level field): name the signing channel(s)
        names = [c.name for c in channels if c.phone_number_id in signed_by]
    # Each change's events belong to the channel of its own phone_number_id.
    unusable: list[str] = []
    events = whatsapp.parse_webhook(
        body, {pid: c.name for pid, c in by_number.items() if pid and pid in signed_by}, skipped=unusable
    )
    return names, events, raw, unusable


def webhook_telegram_accept(
    tenant: str, *, name: str, read_body: Callable[[], bytes], secret: str | None
) -> WebhookAccepted:
    """Accept a Telegram ``Update`` (raw bytes from ``read_body()``) for channel ``name`` sent with ``secret``.

    ``secret`` is the ``X-Telegram-Bot-Api-Secret-Token`` header; the body is read only after it matched.

    Returns the journaled ``WebhookAccepted``. Raises ``WebhookRefused``: 404 no
    Telegram channel ``name`` in ``tenant``; 401 ``bad_secret`` header missing
    or not the channel's ``webhook_secret``; 400 the body is not an ``Update``
    (no JSON object, no ``update_id``, or an unreadable message).
    """

    def accept(channels: list[Channel]) -> tuple[int, list[InboundEvent], list[str]]:
        channel = next((c for c in channels if c.name == name), None)
        if channel is None:
            raise WebhookRefused(404, "not_found", f"Telegram channel {name!r} not found")
        if not channel.check("webhook_secret", secret):
            if not secret:
                raise WebhookRefused(401, "bad_secret", f"{telegram.SECRET_HEADER} is missing")
            raise WebhookRefused(401, "bad_secret", f"{telegram.SECRET_HEADER} does not match")
        update = _json_object(read_body())
        update_id = telegram.update_id(update)
        if update is None or update_id is None:
            raise WebhookRefused(400, "bad_request", "the body is not a Telegram Update")
        unusable: list[str] = []
        try:
            return update_id, telegram.parse_update(update, channel_name=channel.name, skipped=unusable), unusable
        except ValidationError as exc:
            raise WebhookRefused(400, "bad_request", exc.message, exc.field) from exc

    update_id, events, unusable = _checked(tenant, "telegram", accept)
    events, skipped = _storable("telegram", tenant, events, unusable)
    event_id = _journal(tenant, "telegram.update", f"telegram:{name}:{update_id}", name, events)
    log.debug(
        "telegram update for tenant %s channel %s: %d events journaled as %s", tenant, name, len(events), event_id
    )
    return WebhookAccepted(events, skipped, event_id)


def _json_object(raw: bytes) -> dict[str, object] | None:
    try:
        return json_load_object(raw, field="body")
    except ValidationError:  # invalid, not UTF-8, nested too deeply, not an object
        return None


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
        payload={"config": config, "events": [e.to_json() for e in events], "trace": inject_context()},
        idempotency_key=key,
    )
    current = trace.get_current_span()  # the request's span: authenticated now, so filed under the tenant
    if current.is_recording():
        current.set_attributes({"botmesh.tenant": tenant, "botmesh.event_type": type_, "botmesh.events": len(events)})
    return str(record.id)


def _storable(
    kind: str, tenant: str, events: list[InboundEvent], unusable: Sequence[str]
) -> tuple[list[InboundEvent], int]:
    """Return ``(the events the inbox can store, how many were skipped)``.

    ``unusable``: what the parser already skipped (a message without the ids
    it needs, by its path in the body), logged and counted here too.

    An event whose ids the inbox can never store (``inbox.domain.inbound_event_problem``:
    a message id or sender over 200 characters or with ``/``…) would fail
    projection on every attempt and end a dead letter no replay fixes. It is
    skipped with a log line — the parsers' rule for a message without a usable
    ``from``/``id`` — and the others are journaled: refusing the body instead
    would make Meta (and Telegram) redeliver it, good messages included, for days.
    """
    from inbox.domain import inbound_event_problem

    for where in unusable:  # a path in the body and what it lacked (an id, a known status)
        log.warning("%s webhook for tenant %s: %s, skipped", kind, tenant, where)
    kept: list[InboundEvent] = []
    for event in events:
        problem = inbound_event_problem(event)
        if problem is None:
            kept.append(event)
        else:
            log.warning("%s webhook for tenant %s: %s skipped, never storable: %s", kind, tenant, event.kind, problem)
    return kept, len(events) - len(kept) + len(unusable)
