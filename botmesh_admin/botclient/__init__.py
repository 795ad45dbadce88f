"""The bot side of replica coordination (ARCHITECTURE §8): what a Python bot imports to be a good replica.

    from botmesh_admin.botclient import AdminClient, BotReplica, coordinator_for

    admin = AdminClient("http://127.0.0.1:8000", tenant="tienda", bot="tienda-bot", token=BOT_TOKEN)
    coordinator = coordinator_for("kv:sqlite:///var/kv.sqlite3", tenant="tienda", bot="tienda-bot",
                                  lease_ms=15000, replica_id="tienda-bot-1")
    replica = BotReplica(admin, coordinator, provider_id="main").start()
    replica.poll(lambda message: "¡Hola!", since_ms=0)   # turn → handoff check → fenced answer → release
    replica.close()

No Django is needed on the bot side: ``admin`` speaks HTTP with the bot's token
and ``coordination`` talks to Redis or the Kv directly. The wire protocol (the
endpoints, the coordinator's key layout, TTLs and value shapes) is in the
README, "Bot replicas", for bots in other languages.

Logs name a chat only by a keyed hash (``replica.id_hash``: 16 hex digits of HMAC-SHA256 of the chat id),
keyed by ``BOTMESH_HASH_KEY`` (or ``BOTMESH_HASH_KEY_FILE``) when set — the admin's key gives the admin's
hashes — else by a key derived from the bot token.

Trust: a bot coordinating over ``kv:<the admin's Kv URL>`` holds the admin's store credentials and is
fully trusted (the embedded demo on one machine); a bot of another party coordinates over Redis with an
ACL limited to its prefix's keys (README, "Bot replicas").
"""

from __future__ import annotations

from .admin import AdminClient, AdminError, AdminUnavailable, HandoffState, InboundMessage
from .replica import AdminSession, BotReplica, Handled, Transport, coordinator_for

__all__ = [
    "AdminClient",
    "AdminError",
    "AdminSession",
    "AdminUnavailable",
    "BotReplica",
    "Handled",
    "HandoffState",
    "InboundMessage",
    "Transport",
    "coordinator_for",
]
