"""A local fake of the WhatsApp Cloud API and Telegram Bot API send endpoints, for tests and benchmarks.

``FakeProviderServer`` is a threaded ``http.server`` on ``127.0.0.1`` (a free
port). It answers with the bodies of ``fixtures/whatsapp/send_responses.json``
and ``fixtures/telegram/send_responses.json`` and records every request::

    with FakeProviderServer() as fake:
        provider = WhatsAppProvider(fake.base_url, "106540352242922", "token")
        fake.script("573001112233", "window_closed")            # every send to it fails
        fake.script("5215512345678", "rate_limited", times=1)   # once, then accepted
        provider.send(OutboundMessage("whatsapp:+57 300 111 2233", text="hola"))
        assert fake.count("573001112233") == 1

Both APIs share one ``base_url`` (set ``BOTMESH_WHATSAPP_API_BASE`` and
``BOTMESH_TELEGRAM_API_BASE``, or a channel's ``api_base_url``, to it):

- ``POST /{phone_number_id}/messages`` — WhatsApp; recipient = the digits of ``to``;
  accepted answers echo ``to`` as ``contacts[0].input`` and its digits as the
  canonical ``wa_id`` (``+57 300 111 2233`` → ``573001112233``), with a fresh
  ``wamid`` per request.
- ``POST /bot<token>/sendMessage`` — Telegram; recipient = ``chat_id``; accepted
  answers carry a fresh ``message_id`` and the request's chat id and text.

Scripted answers, per recipient (``script``) or for every recipient (``script_all``):

- ``accepted``: WhatsApp 200 ``accepted``; Telegram 200 ``accepted``.
- ``window_closed``: WhatsApp 400, error 131047 (24-hour window). Telegram accepts.
- ``rate_limited``: WhatsApp 429, error 130429; Telegram 429, ``parameters.retry_after: 3``.
- ``bad_token``: WhatsApp 401, error 190 (expired token). Telegram accepts.
- ``blocked``: Telegram 403, bot was blocked by the user. WhatsApp accepts.
- ``chat_not_found``: Telegram 400, chat not found. WhatsApp accepts.
- ``drop``: the request is recorded, then the connection is closed without an
  answer (a provider that received the message but whose answer was lost).

``delay_s`` (constructor, ``script`` or ``set_delay``) holds the answer back to
simulate a slow provider; ``hold()`` holds every answer until ``release()``
(the request is recorded at once, with the id it will be answered with, so a
test can post that id's delivery statuses while the sender still waits). The
recorded requests are in ``requests``; ``count`` and ``wait_for`` read them
safely from any thread.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

WHATSAPP_PATH = re.compile(r"^(?:/.*)?/(?P<phone_number_id>[^/]+)/messages$")
TELEGRAM_PATH = re.compile(r"^(?:/.*)?/bot(?P<token>[^/]+)/sendMessage$")
ANSWERS = {
    "whatsapp": {
        "accepted": (200, "accepted"),
        "window_closed": (400, "outside_24h_window"),
        "rate_limited": (429, "rate_limited"),
        "bad_token": (401, "bad_token"),
    },
    "telegram": {
        "accepted": (200, "accepted"),
        "rate_limited": (429, "too_many_requests"),
        "blocked": (403, "blocked"),
        "chat_not_found": (400, "chat_not_found"),
    },
}
DROP = "drop"


def recipient_key(value: object) -> str:
    """Return the recipient key the server records: digits (and a leading ``-``) of a number or chat id."""
    text = str(value).strip()
    digits = re.sub(r"[^0-9]", "", text)
    return f"-{digits}" if text.startswith("-") else digits


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server received (``headers`` with lower-case names)."""

    provider: str
    path: str
    recipient: str
    body: dict[str, Any]
    headers: dict[str, str]
    answer: str
    status: int | None
    at_ms: int
    provider_message_id: str | None = None  # the id an accepted answer carries (wamid, Telegram message_id)


@dataclass
class _Script:
    answer: str
    remaining: int | None = None
    delay_s: float | None = None


@dataclass
class _State:
    scripts: dict[str, _Script] = field(default_factory=dict)
    default: _Script = field(default_factory=lambda: _Script("accepted"))
    requests: list[RecordedRequest] = field(default_factory=list)
    counter: int = 0


class FakeProviderServer:
    """The fake WhatsApp + Telegram send API. Use as a context manager, or ``start()`` / ``stop()``."""

    def __init__(self, fixtures: Path | None = None, *, delay_s: float = 0.0) -> None:
        if fixtures is None:
            from botmesh_admin.demo import fixtures_dir

            fixtures = fixtures_dir()
        self.bodies = {
            kind: json.loads((Path(fixtures) / kind / "send_responses.json").read_text(encoding="utf-8"))
            for kind in ("whatsapp", "telegram")
        }
        self.delay_s = delay_s
        self._state = _State()
        self._lock = threading.Condition()
        self._gate = threading.Event()  # cleared by ``hold()``: answers wait for ``release()``
        self._gate.set()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------

    def start(self) -> FakeProviderServer:
        """Start serving on a free port of 127.0.0.1; return self."""
        handler = type("Handler", (_Handler,), {"fake": self})
        # socketserver's default listen backlog (5) drops connections beyond five at once, and the
        # client's SYN retry then costs a second: keep a backlog worth of concurrent senders.
        server_class = type("Server", (ThreadingHTTPServer,), {"request_queue_size": 128})
        self._server = server_class(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-provider", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeProviderServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """Return ``http://127.0.0.1:<port>`` (the base URL for both providers)."""
        if self._server is None:
            raise RuntimeError("FakeProviderServer is not started")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # --- scripting -----------------------------------------------------------------

    def script(self, recipient: str, answer: str, *, times: int | None = None, delay_s: float | None = None) -> None:
        """Answer sends to ``recipient`` with ``answer`` (see the table), ``times`` times or forever.

        ``recipient`` is a phone number in any format or a Telegram chat id.
        After ``times`` answers the recipient is accepted again.
        """
        self._check(answer)
        with self._lock:
            self._state.scripts[recipient_key(recipient)] = _Script(answer, times, delay_s)

    def script_all(self, answer: str, *, times: int | None = None, delay_s: float | None = None) -> None:
        """Answer every unscripted recipient with ``answer`` (``times`` times, then ``accepted``)."""
        self._check(answer)
        with self._lock:
            self._state.default = _Script(answer, times, delay_s)

    def set_delay(self, delay_s: float, recipient: str | None = None) -> None:
        """Hold every answer (or those to ``recipient``) back by ``delay_s`` seconds."""
        with self._lock:
            if recipient is None:
                self.delay_s = delay_s
            else:
                script = self._state.scripts.setdefault(recipient_key(recipient), _Script("accepted"))
                script.delay_s = delay_s

    def hold(self) -> None:
        """Hold every answer back until ``release()`` (requests are still recorded as they arrive)."""
        self._gate.clear()

    def release(self) -> None:
        """Let every held answer (and every later one) go."""
        self._gate.set()

    def reset(self) -> None:
        """Forget every script and recorded request (the delay stays)."""
        with self._lock:
            self._state = _State()

    @staticmethod
    def _check(answer: str) -> None:
        known = {DROP} | {name for answers in ANSWERS.values() for name in answers}
        if answer not in known:
            raise ValueError(f"unknown answer {answer!r}; known: {', '.join(sorted(known))}")

    # --- inspection ----------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        """Return a copy of every recorded request, in arrival order."""
        with self._lock:
            return list(self._state.requests)

    def count(self, recipient: str | None = None, *, provider: str | None = None) -> int:
        """Return how many requests were received (for ``recipient`` / ``provider`` if given)."""
        key = recipient_key(recipient) if recipient is not None else None
        with self._lock:
            return sum(
                1
                for r in self._state.requests
                if (key is None or r.recipient == key) and (provider is None or r.provider == provider)
            )

    def wait_for(self, count: int, timeout_s: float = 5.0) -> bool:
        """Block until at least ``count`` requests were recorded; return False on timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: len(self._state.requests) >= count, timeout=timeout_s)

    # --- answering (called by the handler threads) -------------------------------------

    def _answer(
        self, provider: str, path: str, body: dict[str, Any], headers: dict[str, str]
    ) -> tuple[int | None, dict[str, Any] | None, float]:
        recipient = recipient_key(body.get("to") if provider == "whatsapp" else body.get("chat_id", ""))
        with self._lock:
            script = self._state.scripts.get(recipient) or self._state.default
            name = script.answer if script.remaining is None or script.remaining > 0 else "accepted"
            if script.remaining is not None and script.remaining > 0:
                script.remaining -= 1
            if name not in ANSWERS[provider] and name != DROP:
                name = "accepted"  # an answer of the other provider: this one accepts
            self._state.counter += 1
            n = self._state.counter
            delay = script.delay_s if script.delay_s is not None else self.delay_s
            status, payload, answered_id = None, None, None
            if name != DROP:
                status, key = ANSWERS[provider][name]
                payload = copy.deepcopy(self.bodies[provider][key])
                if name == "accepted":
                    self._fill_accepted(provider, payload, body, n)
                    answered_id = (
                        payload["messages"][0]["id"] if provider == "whatsapp" else str(payload["result"]["message_id"])
                    )
            self._state.requests.append(
                RecordedRequest(
                    provider=provider,
                    path=path,
                    recipient=recipient,
                    body=body,
                    headers=headers,
                    answer=name,
                    status=status,
                    at_ms=time.time_ns() // 1_000_000,
                    provider_message_id=answered_id,
                )
            )
            self._lock.notify_all()
        return status, payload, delay

    @staticmethod
    def _fill_accepted(provider: str, payload: dict[str, Any], body: dict[str, Any], n: int) -> None:
        if provider == "whatsapp":
            to = str(body.get("to", ""))
            payload["contacts"] = [{"input": to, "wa_id": recipient_key(to)}]
            payload["messages"] = [{"id": f"wamid.FAKE{n:026X}"}]
        else:
            result = payload["result"]
            result["message_id"] = 1000 + n
            result["chat"] = {**result["chat"], "id": body.get("chat_id")}
            result["text"] = body.get("text")
            result["date"] = int(time.time())


class _Handler(BaseHTTPRequestHandler):
    fake: FakeProviderServer
    server_version = "FakeProvider/1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # quiet: the Telegram path carries the bot token

    def do_POST(self) -> None:  # noqa: N802 - http.server naming
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = None
        provider = (
            "whatsapp" if WHATSAPP_PATH.match(self.path) else "telegram" if TELEGRAM_PATH.match(self.path) else None
        )
        if provider is None or not isinstance(body, dict):
            self._send(404 if provider is None else 400, {"error": "fake provider: unknown path or bad JSON"})
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        status, payload, delay = self.fake._answer(provider, self.path, body, headers)
        if delay:
            time.sleep(delay)
        self.fake._gate.wait(timeout=60)  # ``hold()``: bounded, so a test that forgets never hangs
        if status is None:  # "drop": the request arrived, the answer never does
            self.close_connection = True
            self.connection.close()
            return
        self._send(status, payload or {})

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (its timeout): that is what a slow answer tests


# -- WhatsApp bodies for another business number -----------------------------------------


def whatsapp_body_for_number(
    body: dict[str, Any], *, phone_number_id: str, display_phone_number: str
) -> dict[str, Any]:
    """Return a copy of a Cloud API webhook body as it would arrive for another business number.

    Every change's ``metadata`` names ``phone_number_id`` / ``display_phone_number``,
    and every message and status id (and the ids they refer to: ``context.id``,
    ``reaction.message_id``) gets the suffix ``_<phone_number_id>``, since a wamid
    names one message of one number. Sign the compact JSON of the result with
    ``whatsapp.signature`` (one Meta app, one app secret, for all its numbers).
    For the demo and tests: the shared fixtures hold one number only.
    """
    out = copy.deepcopy(body)

    def other(message_id: Any) -> Any:
        return f"{message_id}_{phone_number_id}" if isinstance(message_id, str) and message_id else message_id

    for entry in out.get("entry") or []:
        for change in entry.get("changes") or []:
            value = change.get("value") or {}
            if isinstance(value.get("metadata"), dict):
                value["metadata"].update(phone_number_id=phone_number_id, display_phone_number=display_phone_number)
            for message in value.get("messages") or []:
                message["id"] = other(message.get("id"))
                if isinstance(message.get("context"), dict):
                    message["context"]["id"] = other(message["context"].get("id"))
                if isinstance(message.get("reaction"), dict):
                    message["reaction"]["message_id"] = other(message["reaction"].get("message_id"))
            for status in value.get("statuses") or []:
                status["id"] = other(status.get("id"))
    return out


def compact_json(body: Any) -> bytes:
    """Return ``body`` as the compact UTF-8 JSON bytes Meta posts (what a signature is computed over)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
