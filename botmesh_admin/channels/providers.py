"""Outbound providers: WhatsApp Cloud API, Telegram Bot API and the console provider.

Every provider has ``send(OutboundMessage) -> SendResult`` and
``broadcast(messages) -> list[SendResult]`` (one result per message, in order).
A provider never raises for what the provider answered: an HTTP error answer is
a ``failed`` result with the provider's code and whether to retry; a network
error or timeout is ``failed`` and retryable (the message may or may not have
been delivered: the outbox decides). Retry rules (ARCHITECTURE §7):

- 429 / WhatsApp 130429 (and other throughput codes): ``rate_limited``, retryable after
  ``retry_after_ms`` (Telegram ``parameters.retry_after`` seconds, else the
  ``Retry-After`` header, else ``DEFAULT_RETRY_AFTER_MS``);
- 5xx and WhatsApp's transient codes (1, 2, 131000, 133004): ``failed``, retryable;
- Telegram 403 (``blocked``), 401 and WhatsApp 190 (``bad_credentials``), WhatsApp
  131047 (``window_closed``), Telegram 400 (chat not found) and every other 4xx:
  not retryable;
- no HTTP answer: ``no_answer``.

Each result's ``outcome`` (``domain.SendOutcome``) comes from the one code table
in ``domain`` (``send_outcome``, ``OUTCOME_OF_CODE``), its ``hint`` from
``send_hint``; readers (the inbox's replies, campaign sending) read those and keep
no code table of their own.

HTTP goes through ``urllib.request`` with a timeout and never follows a
redirect (a redirect is the provider's answer, a failure: following one could
turn a send into a request to somewhere else). Base URLs come from the
channel configuration, else ``settings.BOTMESH_WHATSAPP_API_BASE`` /
``BOTMESH_TELEGRAM_API_BASE`` (validated at start by ``config.load_tuning``), else the
real APIs, so tests point them at ``channels.testing.FakeProviderServer``.
A base URL a tenant entered is checked when it is saved (``validate_api_base_url``)
and again at every connection: the address the socket actually reached must be
public (``public_only``; development also allows loopback, for a local fake
provider), so a host name that resolves — or later re-resolves — to a private
or link-local address (cloud metadata at 169.254.169.254) gets nothing.
Tokens never reach a log line (the Telegram URL holds the bot token).
"""

from __future__ import annotations

import functools
import hashlib
import http.client
import ipaddress
import json
import logging
import socket
import threading
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPException
from typing import Any, Protocol, runtime_checkable

from botmesh_admin.errors import ValidationError
from botmesh_admin.jsonbody import json_load
from botmesh_admin.observability.logs import log_id
from botmesh_admin.validation import ascii_digits

from .domain import (
    WHATSAPP_RATE_LIMIT_CODES,
    WHATSAPP_RETRYABLE_CODES,
    Channel,
    OutboundMessage,
    SendOutcome,
    SendResult,
    send_outcome,
)

log = logging.getLogger("botmesh.channels")

WHATSAPP_API_BASE = "https://graph.facebook.com/v21.0"
TELEGRAM_API_BASE = "https://api.telegram.org"
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_RETRY_AFTER_MS = 1000


@runtime_checkable
class Provider(Protocol):
    """Send messages to one channel account."""

    kind: str

    def send(self, message: OutboundMessage) -> SendResult:
        """Send one message; return its result. Never raise for a provider or network error."""
        ...

    def broadcast(self, messages: Sequence[OutboundMessage]) -> list[SendResult]:
        """Send every message; return one result per message, in the same order."""
        ...


def address_of(chat_key: str, channel: str) -> str:
    """Return the provider address in a chat key: ``whatsapp:573…`` → ``573…``; a group key → the chat id."""
    address = chat_key.removeprefix(f"{channel}:")
    if channel == "telegram" and address.count(":") == 1:
        address = address.split(":", 1)[0]  # "<group chat id>:<user id>": answer in the group
    return address


class _BaseProvider:
    kind = "base"
    max_workers = 1

    def send(self, message: OutboundMessage) -> SendResult:
        raise NotImplementedError

    def broadcast(self, messages: Sequence[OutboundMessage]) -> list[SendResult]:
        """Send every message (``max_workers`` at a time); return the results in order."""
        if self.max_workers <= 1 or len(messages) <= 1:
            return [self.send(m) for m in messages]
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(messages))) as pool:
            return list(pool.map(self.send, messages))


class NotPublicAddress(ConnectionRefusedError):
    """The provider's host resolved to a loopback, private, link-local or otherwise non-public address."""


def ip_address_of(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """Return the IP address written ``text``, an IPv6 zone (``%eth0``) dropped and ``::ffff:a.b.c.d`` read as IPv4."""
    address = ipaddress.ip_address(text.split("%", 1)[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped if mapped is not None else address


def is_public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Return True for a globally routable unicast address: not loopback, private, link-local, reserved, multicast."""
    return address.is_global and not address.is_multicast


def _checked_connection(allow_loopback: bool) -> Any:
    """Return a ``socket.create_connection`` that refuses a peer address that is not public
    (loopback allowed with ``allow_loopback``: a local fake provider in development), before a byte is sent."""

    def create(
        address: tuple[str, int],
        timeout: Any = socket._GLOBAL_DEFAULT_TIMEOUT,  # type: ignore[attr-defined]
        source_address: Any = None,
    ) -> socket.socket:
        sock = socket.create_connection(address, timeout, source_address)
        peer = ip_address_of(str(sock.getpeername()[0]))
        if not (allow_loopback and peer.is_loopback) and not is_public(peer):
            sock.close()
            raise NotPublicAddress(f"{address[0]} resolved to a non-public address")
        return sock

    return create


class _Checked:
    """A connection made through ``_checked_connection``; mixed into http.client's two classes."""

    def __init__(self, *args: Any, allow_loopback: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = _checked_connection(allow_loopback)


class _CheckedHTTPConnection(_Checked, http.client.HTTPConnection):
    pass


class _CheckedHTTPSConnection(_Checked, http.client.HTTPSConnection):
    pass


class _PublicHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, allow_loopback: bool) -> None:
        super().__init__()
        self.connection = functools.partial(_CheckedHTTPConnection, allow_loopback=allow_loopback)

    def http_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(self.connection, req)


class _PublicHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, allow_loopback: bool) -> None:
        super().__init__()
        self.connection = functools.partial(_CheckedHTTPSConnection, allow_loopback=allow_loopback)

    def https_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(self.connection, req, context=self._context)  # type: ignore[attr-defined]


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # urllib then raises HTTPError with the 3xx answer


def _opener(public_only: bool, allow_loopback: bool) -> urllib.request.OpenerDirector:
    handlers: list[Any] = [_NoRedirects()]
    if public_only and not urllib.request.getproxies():  # through a proxy, the proxy's egress rules apply
        handlers += [_PublicHTTPHandler(allow_loopback), _PublicHTTPSHandler(allow_loopback)]
    return urllib.request.build_opener(*handlers)


class _HttpProvider(_BaseProvider):
    def __init__(
        self,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_workers: int = 1,
        public_only: bool = False,
        allow_loopback: bool = False,
    ) -> None:
        self.timeout_s = timeout_s
        self.max_workers = max_workers
        self._opener = _opener(public_only, allow_loopback)

    def _post(
        self, url: str, body: dict[str, Any], headers: dict[str, str]
    ) -> tuple[int, dict[str, Any] | None, str | None] | str:
        """POST JSON; return ``(status, parsed body or None, Retry-After header)`` or a network error name."""
        data = json.dumps(body).encode("utf-8")
        request = urllib.request.Request(
            url, data=data, method="POST", headers={"Content-Type": "application/json", **headers}
        )
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                return response.status, _json(response.read()), response.headers.get("Retry-After")
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, _json(exc.read()), exc.headers.get("Retry-After") if exc.headers else None
        except (urllib.error.URLError, TimeoutError, ConnectionError, HTTPException, OSError) as exc:
            if isinstance(getattr(exc, "reason", None), NotPublicAddress):
                return NotPublicAddress.__name__
            return type(exc).__name__

    def _network_failure(self, message: OutboundMessage, error: str) -> SendResult:
        if error == NotPublicAddress.__name__:  # nothing was sent: a sure failure, not a doubt
            log.warning(
                "%s send to %s refused: the API base URL reaches a non-public address",
                self.kind,
                log_id(message.chat_key),
            )
            return SendResult(
                status="failed",
                chat_key=message.chat_key,
                retryable=False,
                error_title=f"not sent: the channel's {self.kind} API base URL reaches a non-public address",
                outcome=SendOutcome.FAILED,
            )
        log.warning("%s send to %s: no answer (%s)", self.kind, log_id(message.chat_key), error)
        return SendResult(
            status="failed",
            chat_key=message.chat_key,
            error_title=f"no answer from {self.kind} ({error})",
            retryable=True,
            retry_after_ms=DEFAULT_RETRY_AFTER_MS,
            outcome=SendOutcome.NO_ANSWER,
        )


def _json(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json_load(raw or b"null", field="response")
    except ValidationError:  # a provider (or a proxy in front of it) answering garbage
        return None
    return value if isinstance(value, dict) else None


def _object(body: dict[str, Any], name: str) -> dict[str, Any]:
    """Return ``body[name]`` if it is a JSON object, else ``{}`` (provider answers are not trusted)."""
    value = body.get(name)
    return value if isinstance(value, dict) else {}


def _retry_after_header(value: str | None) -> int | None:
    try:
        return max(0, int(float(value) * 1000)) if value else None
    except ValueError:
        return None


class WhatsAppProvider(_HttpProvider):
    """WhatsApp Cloud API: ``POST {base_url}/{phone_number_id}/messages`` with a bearer access token."""

    kind = "whatsapp"

    def __init__(
        self,
        base_url: str,
        phone_number_id: str,
        access_token: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_workers: int = 1,
        public_only: bool = False,
        allow_loopback: bool = False,
    ) -> None:
        super().__init__(
            timeout_s=timeout_s, max_workers=max_workers, public_only=public_only, allow_loopback=allow_loopback
        )
        self.url = f"{base_url.rstrip('/')}/{phone_number_id}/messages"
        self._access_token = access_token

    def __repr__(self) -> str:
        return f"WhatsAppProvider({self.url!r})"

    def payload(self, message: OutboundMessage) -> dict[str, Any]:
        """Return the Graph API JSON body for ``message`` (text, or template with body parameters)."""
        body: dict[str, Any] = {
            "messaging_product": "whatsapp",
            "recipient_type": "individual",
            "to": address_of(message.chat_key, self.kind),
        }
        if message.template is not None:
            template: dict[str, Any] = {
                "name": message.template.name,
                "language": {"code": message.template.language},
            }
            if message.template.parameters:
                template["components"] = [
                    {
                        "type": "body",
                        "parameters": [{"type": "text", "text": p} for p in message.template.parameters],
                    }
                ]
            body.update(type="template", template=template)
        else:
            body.update(type="text", text={"body": message.text, "preview_url": False})
        if message.reply_to:
            body["context"] = {"message_id": message.reply_to}
        return body

    def send(self, message: OutboundMessage) -> SendResult:
        """Send one message; see the module docstring for the result rules."""
        headers = {"Authorization": f"Bearer {self._access_token}"}
        if message.idempotency_key:
            headers["Idempotency-Key"] = message.idempotency_key
        answer = self._post(self.url, self.payload(message), headers)
        if isinstance(answer, str):
            return self._network_failure(message, answer)
        status, body, retry_header = answer
        body = body or {}
        messages = body.get("messages")
        if 200 <= status < 300 and isinstance(messages, list) and messages and messages[0].get("id"):
            contacts = body.get("contacts") if isinstance(body.get("contacts"), list) else []
            wa_id = contacts[0].get("wa_id") if contacts and isinstance(contacts[0], dict) else None
            return SendResult(
                status="accepted",
                chat_key=message.chat_key,
                provider_message_id=str(messages[0]["id"]),
                recipient=str(wa_id) if wa_id else address_of(message.chat_key, self.kind),
                outcome=SendOutcome.ACCEPTED,
            )
        error = _object(body, "error")
        code = error["code"] if isinstance(error.get("code"), int) else status
        rate_limited = status == 429 or code in WHATSAPP_RATE_LIMIT_CODES
        retryable = rate_limited or status >= 500 or code in WHATSAPP_RETRYABLE_CODES
        retry_after = _retry_after_header(retry_header)
        if rate_limited and retry_after is None:
            retry_after = DEFAULT_RETRY_AFTER_MS
        outcome = (
            SendOutcome.RATE_LIMITED
            if rate_limited
            else send_outcome(self.kind, status="failed", error_code=code, retryable=retryable)
        )
        log.info("whatsapp send to %s failed: code %s (%s)", log_id(message.chat_key), code, outcome)
        return SendResult(
            status="failed",
            chat_key=message.chat_key,
            error_code=code,
            error_title=str(error.get("message") or f"HTTP {status}"),
            retryable=retryable,
            retry_after_ms=retry_after if retryable else None,
            outcome=outcome,
        )


class TelegramProvider(_HttpProvider):
    """Telegram Bot API: ``POST {base_url}/bot<token>/sendMessage``."""

    kind = "telegram"

    def __init__(
        self,
        base_url: str,
        bot_token: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_workers: int = 1,
        public_only: bool = False,
        allow_loopback: bool = False,
        channel_name: str | None = None,
    ) -> None:
        super().__init__(
            timeout_s=timeout_s, max_workers=max_workers, public_only=public_only, allow_loopback=allow_loopback
        )
        self._base_url = base_url.rstrip("/")
        self._bot_token = bot_token
        # Message ids are unique per bot and chat: an accepted id is "<bot channel>:<chat>:<id>",
        # like the webhook's (``telegram`` module doc).
        self._id_prefix = f"{channel_name}:" if channel_name else ""

    def __repr__(self) -> str:
        return f"TelegramProvider({self._base_url!r})"

    def payload(self, message: OutboundMessage) -> dict[str, Any]:
        """Return the ``sendMessage`` JSON body for ``message``."""
        address = address_of(message.chat_key, self.kind)
        body: dict[str, Any] = {
            "chat_id": int(address) if ascii_digits(address.removeprefix("-")) else address,
            "text": message.text,
        }
        if message.reply_to:
            reply_id = message.reply_to.rsplit(":", 1)[-1]
            if ascii_digits(reply_id):
                body["reply_parameters"] = {"message_id": int(reply_id), "allow_sending_without_reply": True}
        return body

    def send(self, message: OutboundMessage) -> SendResult:
        """Send one text message (Telegram has no templates: a template is a non-retryable failure)."""
        if message.template is not None:
            return SendResult(
                status="failed",
                chat_key=message.chat_key,
                error_code=400,
                error_title="Telegram has no message templates",
                retryable=False,
                outcome=SendOutcome.FAILED,
                hint="Telegram has no message templates: send text",
            )
        headers = {"Idempotency-Key": message.idempotency_key} if message.idempotency_key else {}
        answer = self._post(f"{self._base_url}/bot{self._bot_token}/sendMessage", self.payload(message), headers)
        if isinstance(answer, str):
            return self._network_failure(message, answer)
        status, body, retry_header = answer
        body = body or {}
        result = _object(body, "result")
        if body.get("ok") is True and "message_id" in result:
            chat_id = _object(result, "chat").get("id")
            return SendResult(
                status="accepted",
                chat_key=message.chat_key,
                provider_message_id=f"{self._id_prefix}{chat_id}:{result['message_id']}",
                recipient=str(chat_id) if chat_id is not None else address_of(message.chat_key, self.kind),
                outcome=SendOutcome.ACCEPTED,
            )
        code: int = body["error_code"] if isinstance(body.get("error_code"), int) else status
        parameters = _object(body, "parameters")
        retry_after = parameters.get("retry_after")
        retryable = code == 429 or code >= 500
        retry_after_ms = (
            int(retry_after * 1000) if isinstance(retry_after, int | float) else _retry_after_header(retry_header)
        )
        if code == 429 and retry_after_ms is None:
            retry_after_ms = DEFAULT_RETRY_AFTER_MS
        outcome = send_outcome(self.kind, status="failed", error_code=code, retryable=retryable)
        log.info("telegram send to %s failed: code %s (%s)", log_id(message.chat_key), code, outcome)
        return SendResult(
            status="failed",
            chat_key=message.chat_key,
            error_code=code,
            error_title=str(body.get("description") or f"HTTP {status}"),
            retryable=retryable,
            retry_after_ms=retry_after_ms if retryable else None,
            outcome=outcome,
        )


CONSOLE_ID_PREFIX = "console."
"""How every provider message id the console provider hands out starts (the inbox labels such replies)."""


class ConsoleProvider(_BaseProvider):
    """The embedded default: logs a hashed recipient and accepts every message.

    The same ``idempotency_key`` gets the same provider id; the last
    ``history_size`` sends are kept in ``sent`` (for the demo and tests).
    """

    kind = "console"

    def __init__(self, channel: str = "console", *, history_size: int = 1000) -> None:
        self.channel = channel
        self.sent: deque[OutboundMessage] = deque(maxlen=history_size)
        self._lock = threading.Lock()
        self._counter = 0

    def send(self, message: OutboundMessage) -> SendResult:
        """Log and accept ``message``."""
        with self._lock:
            self._counter += 1
            self.sent.append(message)
            seed = message.idempotency_key or f"{id(self)}:{self._counter}"
        provider_id = CONSOLE_ID_PREFIX + hashlib.sha256(seed.encode()).hexdigest()[:20]
        log.info("console %s send to %s accepted as %s", self.channel, log_id(message.chat_key), provider_id)
        return SendResult(
            status="accepted",
            chat_key=message.chat_key,
            provider_message_id=provider_id,
            recipient=address_of(message.chat_key, self.channel),
            outcome=SendOutcome.ACCEPTED,
        )


class UnconfiguredProvider(_BaseProvider):
    """A production channel without credentials: every send fails, not retryable, saying why."""

    kind = "unconfigured"

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def send(self, message: OutboundMessage) -> SendResult:
        """Return a non-retryable failure naming the missing credential."""
        return SendResult(
            status="failed",
            chat_key=message.chat_key,
            error_title=self.reason,
            retryable=False,
            outcome=SendOutcome.FAILED,
            hint=self.reason,
        )


def api_base(kind: str, channel: Channel | None = None) -> str:
    """Return the API base URL: the channel's override, else the setting/env, else the real API."""
    from django.conf import settings

    if channel is not None and channel.api_base_url:
        return channel.api_base_url
    name = "BOTMESH_WHATSAPP_API_BASE" if kind == "whatsapp" else "BOTMESH_TELEGRAM_API_BASE"
    configured = getattr(settings, name, None)  # validated at start by config.load_tuning
    return configured or (WHATSAPP_API_BASE if kind == "whatsapp" else TELEGRAM_API_BASE)


_console: dict[str, ConsoleProvider] = {}


def provider_for(tenant: str, channel: Channel | None) -> Provider:
    """Return the provider that sends through ``channel`` (a ``selectors`` value of ``tenant``).

    WhatsApp needs ``phone_number_id`` and ``access_token``; Telegram ``bot_token``.
    Without them (or without a channel) the dev profile sends to the console and
    production gets an ``UnconfiguredProvider`` that fails every send. A base
    URL the tenant entered may only reach public addresses (``public_only``) —
    in development also this machine (a local fake provider) — checked at every
    connection; the operator's ``BOTMESH_*_API_BASE`` is trusted.
    """
    from django.conf import settings

    if channel is not None and channel.tenant != tenant:
        raise ValueError("channel belongs to another tenant")
    public_only = bool(channel is not None and channel.api_base_url)
    allow_loopback = not settings.CONFIG.production
    if channel is not None and channel.kind == "whatsapp":
        token = channel.secret("access_token")
        if token and channel.phone_number_id:
            return WhatsAppProvider(
                api_base("whatsapp", channel),
                channel.phone_number_id,
                token,
                public_only=public_only,
                allow_loopback=allow_loopback,
            )
    if channel is not None and channel.kind == "telegram":
        token = channel.secret("bot_token")
        if token:
            return TelegramProvider(
                api_base("telegram", channel),
                token,
                public_only=public_only,
                allow_loopback=allow_loopback,
                channel_name=channel.name,
            )
    if settings.CONFIG.production:
        what = f"channel {channel.name!r}" if channel is not None else "this tenant"
        return UnconfiguredProvider(f"{what} has no credentials to send with")
    kind = channel.kind if channel is not None else "console"
    return _console.setdefault(kind, ConsoleProvider(kind))
