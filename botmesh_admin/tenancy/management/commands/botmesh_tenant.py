"""``manage.py botmesh_tenant create <id> --name N [--admin USER] [--agent USER]``."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from botmesh_admin.errors import DomainError
from botmesh_admin.tenancy import services


class Command(BaseCommand):
    help = "Create a tenant (or update its name) and give users roles in it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["create"])
        parser.add_argument("tenant")
        parser.add_argument("--name", default=None)
        parser.add_argument("--region", default="CO", help="default phone region (ISO 3166)")
        parser.add_argument("--admin", action="append", default=[], help="user name to make admin")
        parser.add_argument("--agent", action="append", default=[], help="user name to make agent")

    def handle(self, *args, **opts) -> None:  # type: ignore[no-untyped-def]
        try:
            services.tenant_create(opts["tenant"], name=opts["name"] or opts["tenant"], default_region=opts["region"])
            for user in opts["admin"]:
                services.membership_set(opts["tenant"], username=user, role="admin")
            for user in opts["agent"]:
                services.membership_set(opts["tenant"], username=user, role="agent")
        except DomainError as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(f"tenant {opts['tenant']} ready")
