"""``manage.py restore PATH`` — restore a backup into this (stopped, empty) installation."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from botmesh_admin.backup import BackupError, backup_restore


class Command(BaseCommand):
    help = (
        "Restore the backup at PATH (written by `manage.py backup`) into this installation. "
        "Stop the web, worker and beat processes first. Refuses a backup written by a newer "
        "schema, a different store layout, or a non-empty installation (unless --force)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path", help="backup directory, or .tar / .tar.gz file")
        parser.add_argument(
            "--force", action="store_true",
            help="replace the data of a non-empty installation (database and Kv replaced, journal merged)",
        )  # fmt: skip
        parser.add_argument("--no-migrate", action="store_true", help="do not run migrate after the restore")

    def handle(self, *args: Any, **options: Any) -> None:
        say = self.stdout.write if options["verbosity"] >= 1 else (lambda _: None)
        try:
            doc = backup_restore(options["path"], force=options["force"], migrate=not options["no_migrate"], say=say)
        except BackupError as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(
            f"restored the backup of {doc['created_at']} (botmesh-admin {doc['app_version']}); "
            "start the web, worker and beat processes again"
        )
