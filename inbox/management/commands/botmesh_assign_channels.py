"""``manage.py botmesh_assign_channels [--tenant T] [--channel KIND=NAME ...]``: give old conversations their channel.

A conversation belongs to the channel configuration that received it
(``inbox.domain``). Conversations stored by an earlier version have none: this
command assigns each the tenant's only channel of its kind, or the one named
with ``--channel whatsapp=main`` (per kind; the tenant's channel of that name).
When a tenant has several channels of a kind and none is named, its
conversations of that kind are left, counted and named in the output; until
then the first channel that hears from such a chat claims it, and a reply in
one fails with the reason rather than going out from a guessed number.

Progress is printed per page; idempotent (an assigned conversation is skipped)
and resumable (run it again after an interruption: it walks again and skips
what is done); safe while the admin runs. Exit status 0; the last line says
how many conversations are left without a channel.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser


def channel_choices(tenant: str, named: dict[str, str]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Return ``(kind → channel name to assign, kind → the tenant's channel names)`` for ``tenant``.

    Raise ``CommandError`` if a ``--channel`` name is not a channel of that kind of the tenant.
    """
    from botmesh_admin.channels.selectors import channel_config_list

    of_kind: dict[str, list[str]] = {}
    for channel in channel_config_list(tenant):
        of_kind.setdefault(channel.kind, []).append(channel.name)
    names = {kind: found[0] for kind, found in of_kind.items() if len(found) == 1}
    for kind, name in named.items():
        if name not in of_kind.get(kind, []):
            raise CommandError(f"--channel {kind}={name}: tenant {tenant!r} has no {kind} channel {name!r}")
        names[kind] = name
    return names, of_kind


class Command(BaseCommand):
    help = "Assign conversations stored before they belonged to a channel to their channel (idempotent, resumable)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", help="only this tenant")
        parser.add_argument(
            "--channel",
            action="append",
            default=[],
            metavar="KIND=NAME",
            help="assign this kind's conversations to the channel NAME (when a tenant has several)",
        )
        parser.add_argument("--batch", type=int, default=200, help="conversations per page (1-5000)")

    def handle(self, *args: Any, **options: Any) -> int | None:
        from botmesh_admin.dashboard.management.commands.botmesh_reindex import tenant_ids
        from inbox.services import conversation_channels_assign

        named: dict[str, str] = {}
        for item in options["channel"]:
            kind, sep, name = item.partition("=")
            if not sep or not kind or not name:
                raise CommandError(f"--channel {item!r}: write KIND=NAME, e.g. whatsapp=main")
            named[kind] = name
        if not 1 <= options["batch"] <= 5000:
            raise CommandError("--batch: must be 1-5000")
        verbose = options["verbosity"] > 0
        total_left = 0
        for tenant in tenant_ids(options["tenant"]):
            names, of_kind = channel_choices(tenant, named)
            totals = {"checked": 0, "assigned": 0, "left": 0}
            after: str | None = None
            while True:
                counts, after = conversation_channels_assign(tenant, names=names, after=after, limit=options["batch"])
                for key, value in counts.items():
                    totals[key] += value
                if verbose and (totals["assigned"] or after is not None):
                    self.stdout.write(
                        f"botmesh_assign_channels: {tenant}: {totals['checked']} conversations checked, "
                        f"{totals['assigned']} assigned, {totals['left']} left"
                    )
                if after is None:
                    break
            total_left += totals["left"]
            if totals["assigned"] or verbose:
                self.stdout.write(
                    f"botmesh_assign_channels: {tenant}: done: {totals['assigned']} assigned, "
                    f"{totals['left']} left without a channel"
                )
            if totals["left"]:
                several = {k: v for k, v in of_kind.items() if k not in names and len(v) > 1}
                hint = (
                    "; ".join(f"{k} has {', '.join(v)}" for k, v in sorted(several.items()))
                    or "no channel of their kind"
                )
                self.stderr.write(
                    f"botmesh_assign_channels: {tenant}: {totals['left']} conversation(s) could not be "
                    f"assigned ({hint}): run with --tenant {tenant} --channel KIND=NAME"
                )
        if verbose or total_left:
            self.stdout.write(f"botmesh_assign_channels: {total_left} conversation(s) left without a channel")
        self.left = total_left
        return None
