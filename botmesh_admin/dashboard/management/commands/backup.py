"""``manage.py backup PATH`` — back up the database, the Kv and the event journal while running."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from botmesh_admin.backup import BackupError, backup_create


class Command(BaseCommand):
    help = (
        "Write a backup of the Django database, the Kv store and the event journal to PATH "
        "(a new directory, or a .tar / .tar.gz file). Safe while the web, worker and beat "
        "processes keep running."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path", help="new directory, or file ending in .tar, .tar.gz or .tgz")

    def handle(self, *args: Any, **options: Any) -> None:
        say = self.stdout.write if options["verbosity"] >= 1 else (lambda _: None)
        try:
            doc = backup_create(options["path"], say=say)
        except BackupError as exc:
            raise CommandError(exc.message) from None
        schema = ", ".join(f"{app} {name}" for app, name in doc["schema"].items())
        say(f"schema: {schema}")
        self.stdout.write(f"backup written to {options['path']} in {doc['duration_s']:.1f} s")
