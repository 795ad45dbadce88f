"""Who is acting, inside which tenant, with which role."""

from __future__ import annotations

import re
from dataclasses import dataclass

from botmesh_admin.errors import PermissionDenied

ROLE_RANK = {"bot": 0, "agent": 1, "admin": 2}

TOKEN_AGENT_RE = re.compile(r"token-([0-9]+)")
"""The form of the agent id an API token acts as (``token_agent``); no member may be named so."""


def token_agent(token_id: int | None) -> str:
    """Return the agent id API token ``token_id`` acts as in the inbox: ``token-<id>``.

    (``Principal.token_id`` is ``None`` only for a caller that is no token; the
    inbox names every non-user principal this way, as it always has.)
    """
    return f"token-{token_id}"


def token_of_agent(agent_id: str) -> int | None:
    """Return the token id of an agent id ``token_agent`` made, or ``None`` for any other (a username)."""
    m = TOKEN_AGENT_RE.fullmatch(agent_id)
    if m is None or m.group(1).startswith("0") or len(m.group(1)) > 18:  # never made by token_agent
        return None
    return int(m.group(1))


@dataclass(frozen=True)
class Principal:
    """The caller of a request, already bound to one tenant.

    ``actor`` is what audit trails record: ``user:<username>`` or ``token:<name>``. ``bot``: the bot id a
    bot-role token is bound to (``ApiToken.bot``), else ``None``.
    """

    tenant: str
    role: str
    actor: str
    user_id: int | None = None
    token_id: int | None = None
    bot: str | None = None

    def can(self, role: str) -> bool:
        """Return True if this principal may act as ``role``.

        Humans rank admin > agent. ``bot`` is the role of a bot's API token: it
        may push its ledger and metrics and read handoffs, which admins may too;
        agents may not (they would forge customer messages).
        """
        if role == "bot":
            return self.role in ("bot", "admin")
        return ROLE_RANK.get(self.role, 0) >= ROLE_RANK[role]

    def require(self, role: str) -> None:
        """Raise ``PermissionDenied`` (403) unless the principal has ``role`` or above."""
        if not self.can(role):
            raise PermissionDenied(f"this action needs the {role} role in tenant {self.tenant!r}")

    def require_bot(self, bot: str) -> None:
        """Raise ``PermissionDenied`` (403) if a bot-role principal acts as a bot other than its own.

        A bot token answers, reads the feed and pushes metrics only as the bot it was created for
        (``ApiToken.bot``); admins may act as any bot of their tenant.
        """
        if self.role == "bot" and self.bot != bot:
            own = repr(self.bot) if self.bot is not None else "no bot"
            raise PermissionDenied(f"this token is bound to {own}, not to bot {bot!r}")
