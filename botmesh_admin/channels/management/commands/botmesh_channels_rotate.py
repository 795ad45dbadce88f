"""``manage.py botmesh_channels_rotate`` — re-encrypt channel secrets with the newest credentials key."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from botmesh_admin.channels.services import channel_credentials_rotate
from botmesh_admin.errors import DomainError


class Command(BaseCommand):
    help = (
        "Re-encrypt every stored channel secret with the first key of BOTMESH_CREDENTIALS_KEYS. "
        "Run after adding a new key in front; afterwards the old key may be removed."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            changed = channel_credentials_rotate()
        except DomainError as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(f"re-encrypted {changed} channel secrets with the newest key")
