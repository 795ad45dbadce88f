"""``python -m botmesh_admin.botclient.demo_bot``: the demo's ``tienda-bot``, one replica process.

``./dev run`` starts three of these (``--bot-replicas N``). Each polls the
admin's inbound feed every ``--poll-ms``, answers every unanswered message of
a chat no human holds with a scripted reply (a greeting and a menu: ``menu``,
``horario``, ``envío``, ``pedido``) under the chat's turn, leads
``provider:<--provider>`` while the admin answers (the console provider's
session) and ``scheduler`` (which sweeps the whole feed every
``--sweep-s`` seconds for messages a replica missed). SIGTERM / SIGINT stop it
cleanly (pushes what is left, releases its leases); SIGKILL leaves its leases
to expire after ``--lease-ms``.

Configuration: ``BOTMESH_BOT_TOKEN`` (the bot token) and ``BOTMESH_COORDINATION_URL``
(the coordinator URL: ``redis://user:password@…``, ``kv:<Kv URL>``, ``memory:``) from the
environment or the file named by ``<NAME>_FILE`` (``botmesh_admin.config.env``), never on the
command line, where ``ps`` shows them; the options below. No Django.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
import unicodedata

from .admin import AdminClient, AdminError, InboundMessage
from .replica import AdminSession, BotReplica, coordinator_for, wall_ms

MENU = "Escribe: menu, horario, envío o pedido."
ANSWERS = {
    "menu": "Menú: 1) catálogo 2) horario 3) envíos 4) estado de tu pedido. " + MENU,
    "horario": "Atendemos de lunes a sábado, de 9:00 a 19:00.",
    "envio": "Enviamos a todo el país en 24-72 h; gratis desde $150.000.",
    "pedido": "Para ver tu pedido escribe su número (p. ej. 10234); una persona te responde si hace falta.",
}
GREETINGS = ("hola", "buenas", "buenos", "hi", "hello", "/start")


def _plain(text: str) -> str:
    folded = unicodedata.normalize("NFKD", text.casefold())
    return "".join(ch for ch in folded if not unicodedata.combining(ch))


def scripted_reply(message: InboundMessage) -> str:
    """Return the demo's answer: a keyword's answer, a greeting with the menu, or the menu."""
    text = _plain(message.text or "")
    for keyword, answer in ANSWERS.items():
        if keyword in text:
            return answer
    if any(word in text for word in GREETINGS):
        return (
            f"¡Hola{', ' + message.sender_name if message.sender_name else ''}! Soy el asistente de la tienda. {MENU}"
        )
    return f"Gracias por tu mensaje. {MENU}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="demo_bot", description=__doc__.splitlines()[0])
    parser.add_argument("--admin-url", default="http://127.0.0.1:8000")
    parser.add_argument("--tenant", default="tienda")
    parser.add_argument("--bot", default="tienda-bot")
    parser.add_argument("--replica-id", required=True)
    parser.add_argument(
        "--coordination",
        default=None,
        help="coordinator URL without credentials (memory:, kv:sqlite:///…); default and for any URL holding "
        "a password: BOTMESH_COORDINATION_URL (or _FILE) in the environment, which ps does not show",
    )
    parser.add_argument("--lease-ms", type=int, default=15000)
    parser.add_argument("--provider", default="main", help="the exclusive transport led: provider:<id>")
    parser.add_argument("--provider-down-ms", type=int, default=5000)
    parser.add_argument("--poll-ms", type=int, default=1000)
    parser.add_argument("--since-ms", type=int, default=0, help="first sweep: messages at or after this epoch ms")
    parser.add_argument("--window-ms", type=int, default=120_000, help="later polls: this far back")
    parser.add_argument("--sweep-s", type=float, default=60.0)
    parser.add_argument("--push-every-ms", type=int, default=10_000)
    parser.add_argument("--handled-log", default=None, help="append one JSON line per handled message")
    parser.add_argument(
        "--handle-ms", type=int, default=0, help="time each answer takes inside the turn (a failover test's window)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    from botmesh_admin.config import env

    token = env("BOTMESH_BOT_TOKEN")  # or the file named by BOTMESH_BOT_TOKEN_FILE, as every secret
    if not token:
        print(
            "demo_bot: BOTMESH_BOT_TOKEN (or BOTMESH_BOT_TOKEN_FILE) is not set (a bot token of the tenant)",
            file=sys.stderr,
        )
        return 2

    coordination = args.coordination or env("BOTMESH_COORDINATION_URL")
    if not coordination:
        print("demo_bot: BOTMESH_COORDINATION_URL (or _FILE, or --coordination) is not set", file=sys.stderr)
        return 2

    admin = AdminClient(args.admin_url, tenant=args.tenant, bot=args.bot, token=token)
    coordinator = coordinator_for(
        coordination, tenant=args.tenant, bot=args.bot, lease_ms=args.lease_ms, replica_id=args.replica_id
    )
    replica = BotReplica(
        admin,
        coordinator,
        provider_id=args.provider,
        transport=AdminSession(admin),
        provider_down_ms=args.provider_down_ms,
        push_every_ms=args.push_every_ms,
        handled_log=args.handled_log,
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())

    def answer(message: InboundMessage) -> str:
        if args.handle_ms:
            time.sleep(args.handle_ms / 1000)
        return scripted_reply(message)

    def sweep() -> None:
        replica.poll(answer, since_ms=args.since_ms, max_pages=1000)

    replica.every(args.sweep_s, sweep)
    replica.start()
    print(f"tienda-bot replica {replica.replica_id}/{replica.incarnation} pid {os.getpid()} started", flush=True)
    since = args.since_ms
    while not stop.is_set():
        started = wall_ms()
        try:
            replica.poll(answer, since_ms=since, max_pages=1000 if since == args.since_ms else 5)
            since = max(args.since_ms, started - args.window_ms)
        except AdminError as exc:
            logging.getLogger("botmesh.botclient").warning("poll failed: %s %s", exc.status, exc.code)
        stop.wait(args.poll_ms / 1000)
    replica.close()
    print(f"tienda-bot replica {replica.replica_id} stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
