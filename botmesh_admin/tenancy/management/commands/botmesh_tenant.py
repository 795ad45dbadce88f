"""``manage.py botmesh_tenant create <id> --name N [--admin USER] [--agent USER]`` and
``manage.py botmesh_tenant erase <id> --yes``."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from botmesh_admin.errors import DomainError
from botmesh_admin.tenancy import services


class Command(BaseCommand):
    help = "Create a tenant (or update its name) and give users roles in it, or erase a tenant for good."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["create", "erase"])
        parser.add_argument("tenant")
        parser.add_argument("--name", default=None)
        parser.add_argument("--region", default="CO", help="default phone region (ISO 3166)")
        parser.add_argument("--admin", action="append", default=[], help="user name to make admin")
        parser.add_argument("--agent", action="append", default=[], help="user name to make agent")
        parser.add_argument("--yes", action="store_true", help="erase: confirm (nothing can be restored but a backup)")

    def handle(self, *args, **opts) -> None:  # type: ignore[no-untyped-def]
        if opts["action"] == "erase":
            self._erase(opts["tenant"], confirmed=opts["yes"])
            return
        try:
            services.tenant_create(opts["tenant"], name=opts["name"] or opts["tenant"], default_region=opts["region"])
            for user in opts["admin"]:
                services.membership_set(opts["tenant"], username=user, role="admin")
            for user in opts["agent"]:
                services.membership_set(opts["tenant"], username=user, role="agent")
        except DomainError as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(f"tenant {opts['tenant']} ready")

    def _erase(self, tenant: str, *, confirmed: bool) -> None:
        if not confirmed:
            raise CommandError(
                f"erase deletes every record of tenant {tenant!r} in every package, its journal, traces, "
                "metrics, tokens, channels and memberships for good; pass --yes"
            )

        def show(line: str) -> None:
            self.stdout.write(f"  {line}")
            self.stdout.flush()  # a killed erasure shows how far it got

        try:
            services.tenant_erase(tenant, progress=show)
        except DomainError as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(f"tenant {tenant} erased (running this again is harmless)")
