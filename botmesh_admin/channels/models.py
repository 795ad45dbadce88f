"""Per-tenant channel configuration (WhatsApp Cloud API numbers, Telegram bots).

Secrets never sit here in clear: ``*_encrypted`` columns hold Fernet tokens
(``credentials.encrypt``), ``*_hash`` columns salted SHA-256 digests
(``credentials.secret_hash``). Read and write through ``selectors`` and
``services`` only; they return ``domain.Channel`` values.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from botmesh_admin.tenancy.models import Tenant


class ChannelKind(models.TextChoices):
    WHATSAPP = "whatsapp", "WhatsApp"
    TELEGRAM = "telegram", "Telegram"


class ChannelConfig(models.Model):
    """One channel of a tenant: a WhatsApp business number or a Telegram bot, named per tenant."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="channel_configs")
    kind = models.CharField(max_length=16, choices=ChannelKind.choices)
    name = models.CharField(max_length=63)
    # Public identifiers.
    phone_number_id = models.CharField(max_length=32, blank=True, default="")
    display_phone_number = models.CharField(max_length=32, blank=True, default="")
    bot_username = models.CharField(max_length=64, blank=True, default="")
    api_base_url = models.CharField(max_length=200, blank=True, default="")
    # Secrets needed in clear later: encrypted (MultiFernet).
    app_secret_encrypted = models.TextField(blank=True, default="")
    access_token_encrypted = models.TextField(blank=True, default="")
    bot_token_encrypted = models.TextField(blank=True, default="")
    # Secrets only ever compared: hashed.
    verify_token_hash = models.CharField(max_length=128, blank=True, default="")
    webhook_secret_hash = models.CharField(max_length=128, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant_id", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="channel_name_unique_per_tenant"),
            models.UniqueConstraint(
                fields=["tenant", "phone_number_id"],
                condition=Q(kind="whatsapp") & ~Q(phone_number_id=""),
                name="whatsapp_number_unique_per_tenant",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.name} ({self.kind})"
