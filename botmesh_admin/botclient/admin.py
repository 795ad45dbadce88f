"""The admin's HTTP API as a bot replica calls it (stdlib only: no Django on the bot side).

Every call sends ``Authorization: Bearer <bot token>`` (a tenant API token of
role ``bot``: ``manage.py botmesh_token create <tenant> --role bot``) and JSON;
every answer is JSON, errors as ``{"error": code, "message": ..., "field": ...}``
(raised here as ``AdminError`` with ``status`` and ``code``). Paths are under
``<admin url>/api/v1/tenants/<tenant>/``; the bot id is percent-escaped whole.
Times are epoch milliseconds.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode


class AdminError(Exception):
    """The admin answered an error: ``status`` (HTTP), ``code`` (``stale_fence``, ``handed_off``, …), ``body``."""

    def __init__(self, status: int, code: str, message: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.body = body or {}


class AdminUnavailable(AdminError):
    """The admin could not be reached (connection refused, timeout): ``status`` 0."""


@dataclass(frozen=True, slots=True)
class InboundMessage:
    """One inbound message from ``GET …/bots/{bot}/inbound`` (field names as on the wire)."""

    id: str
    conversation_id: str
    chat_id: str
    channel: str
    channel_name: str | None
    sender_id: str | None
    sender_name: str | None
    type: str
    text: str | None
    timestamp_ms: int
    handed_off: bool
    answered: bool

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InboundMessage:
        return cls(**{name: data.get(name) for name in cls.__dataclass_fields__})  # type: ignore[arg-type]

    @property
    def turn_key(self) -> str:
        """Return the coordinator key of this chat's turns: ``chat:<channel name>|<chat id>``.

        (``chat:<chat id>`` for a conversation without a channel.) Every replica of
        one bot derives the same key, so the chat's messages are handled one at a time.
        """
        return f"chat:{self.channel_name}|{self.chat_id}" if self.channel_name else f"chat:{self.chat_id}"


@dataclass(frozen=True, slots=True)
class HandoffState:
    """``GET …/handoff/{chat_id}``: ``handed_off`` True while a human holds the chat."""

    chat_id: str
    handed_off: bool
    conversation_id: str | None = None
    taken_by: str | None = None
    taken_at_ms: int | None = None


class AdminClient:
    """The bot endpoints of one tenant for one bot (see the module docstring for the protocol)."""

    def __init__(self, base_url: str, *, tenant: str, bot: str, token: str, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.tenant = tenant
        self.bot = bot
        self._token = token
        self.timeout_s = timeout_s

    def __repr__(self) -> str:  # never the token
        return f"<AdminClient {self.base_url} tenant={self.tenant} bot={self.bot}>"

    @property
    def _bot_path(self) -> str:
        return f"/api/v1/tenants/{quote(self.tenant, safe='')}/bots/{quote(self.bot, safe='')}"

    def request(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json"
    ) -> tuple[int, Any]:
        """Send one request; return ``(status, decoded JSON)`` for a 2xx, else raise ``AdminError``."""
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self._token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                err = json.loads(raw)
            except ValueError:
                err = {"error": "http_error", "message": raw[:200].decode(errors="replace")}
            if not isinstance(err, dict):
                err = {"error": "http_error", "message": str(err)[:200]}
            raise AdminError(exc.code, str(err.get("error")), str(err.get("message")), err) from None
        except (OSError, ValueError) as exc:  # URLError, timeouts, a body that is not JSON
            raise AdminUnavailable(0, "unavailable", f"{type(exc).__name__}: {exc}") from None

    # -- the endpoints -------------------------------------------------------------------

    def inbound(
        self, *, since_ms: int, after: str | None = None, limit: int = 50
    ) -> tuple[list[InboundMessage], str | None]:
        """``GET …/bots/{bot}/inbound?since_ms=&after=&limit=``: one page of inbound messages and ``next``."""
        query = {"since_ms": since_ms, "limit": limit, **({"after": after} if after else {})}
        _, page = self.request("GET", f"{self._bot_path}/inbound?{urlencode(query)}")
        return [InboundMessage.from_json(item) for item in page["items"]], page.get("next")

    def reply(self, message: InboundMessage, text: str, *, fence: int) -> tuple[dict[str, Any], bool]:
        """``POST …/bots/{bot}/replies``: queue the answer to ``message`` fenced by the turn's ``fence``.

        Return ``(reply message, created)``; ``created`` False when another replica
        answered first. Raise ``AdminError`` 409 ``stale_fence`` (a later turn replied)
        or ``handed_off`` (a human holds the chat).
        """
        body = {"conversation_id": message.conversation_id, "in_reply_to": message.id, "text": text, "fence": fence}
        _, answer = self.request("POST", f"{self._bot_path}/replies", body)
        return answer["message"], bool(answer["created"])

    def handoff(self, chat_id: str, *, channel: str | None = None) -> HandoffState:
        """``GET …/handoff/{chat_id}?channel=<name>``: is the chat held by a human?"""
        query = f"?{urlencode({'channel': channel})}" if channel else ""
        path = f"/api/v1/tenants/{quote(self.tenant, safe='')}/handoff/{quote(chat_id, safe='')}{query}"
        _, state = self.request("GET", path)
        return HandoffState(
            state["chat_id"], bool(state["handed_off"]), state.get("conversation_id"), state.get("taken_by"),
            state.get("taken_at_ms"),
        )  # fmt: skip

    def ledger_push(self, records: list[dict[str, Any]]) -> dict[str, int]:
        """``POST …/ledger`` (a JSON array of StoredMessage records): ``{records, accepted, duplicates}``."""
        _, answer = self.request("POST", f"/api/v1/tenants/{quote(self.tenant, safe='')}/ledger", records)
        return dict(answer)

    def metrics_push(self, replica_id: str, snapshot: dict[str, Any]) -> dict[str, Any]:
        """``POST …/bots/{bot}/metrics`` with ``{"replica": <id>, ...snapshot}``: the stored sample."""
        _, answer = self.request("POST", f"{self._bot_path}/metrics", {"replica": replica_id, **snapshot})
        return dict(answer)

    def healthy(self) -> bool:
        """Return True if ``GET /healthz`` answers 200 (the admin is reachable)."""
        try:
            with urllib.request.urlopen(self.base_url + "/healthz", timeout=min(self.timeout_s, 2.0)) as resp:
                return bool(resp.status == 200)
        except (OSError, ValueError):
            return False
