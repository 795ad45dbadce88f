"""``manage.py botmesh_token create <tenant> --name N [--role admin|agent|bot] [--bot B]`` / ``revoke <tenant> <id>``.

A bot token acts only as its bot: ``--bot`` (default: ``--name``).
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from botmesh_admin.errors import DomainError
from botmesh_admin.tenancy import selectors, services


class Command(BaseCommand):
    help = "Create, list or revoke a tenant's API tokens. A new token is printed once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["create", "revoke", "list"])
        parser.add_argument("tenant")
        parser.add_argument("token_id", nargs="?", type=int)
        parser.add_argument("--name", default="cli")
        parser.add_argument("--role", default="admin", choices=["admin", "agent", "bot"])
        parser.add_argument("--bot", default=None, help="role bot: the one bot id it acts as (default: --name)")

    def handle(self, *args, **opts) -> None:  # type: ignore[no-untyped-def]
        try:
            if opts["action"] == "create":
                _, plaintext = services.token_create(
                    opts["tenant"], name=opts["name"], role=opts["role"], created_by="cli", bot=opts["bot"]
                )
                self.stdout.write(plaintext)
            elif opts["action"] == "revoke":
                if opts["token_id"] is None:
                    raise CommandError("revoke needs the token id (see `list`)")
                services.token_revoke(opts["tenant"], token_id=opts["token_id"])
                self.stdout.write(f"token {opts['token_id']} revoked")
            else:
                for t in selectors.token_list(opts["tenant"]):
                    state = "revoked" if t.revoked_at else "active"
                    role = f"bot:{t.bot}" if t.bot is not None else t.role
                    self.stdout.write(f"{t.pk}\t{t.name}\t{role}\tbm_{t.prefix}_…\t{state}")
        except DomainError as exc:
            raise CommandError(exc.message) from None
