"""Tenant, Membership (roles) and ApiToken (stored hashed)."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models

TENANT_ID_RE = r"^[a-z0-9][a-z0-9_-]{0,62}$"


class Role(models.TextChoices):
    AGENT = "agent", "Agent"
    ADMIN = "admin", "Admin"
    BOT = "bot", "Bot (API token only: ledger and metrics push, handoff reads)"


HUMAN_ROLES = (str(Role.AGENT), str(Role.ADMIN))


class Tenant(models.Model):
    """One isolated customer of the admin. ``id`` follows the tenant id rule (ARCHITECTURE §4)."""

    id = models.CharField(
        primary_key=True,
        max_length=63,
        validators=[RegexValidator(TENANT_ID_RE, "1-63 of a-z 0-9 _ -, starting with a letter or digit")],
    )
    name = models.CharField(max_length=200)
    default_region = models.CharField(
        max_length=2, default="CO", help_text="ISO 3166 region for phone numbers written without +"
    )
    time_zone = models.CharField(
        max_length=64,
        blank=True,
        default="",
        help_text="IANA zone the pages show times in (America/Bogota); empty until chosen: UTC",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.id


class Membership(models.Model):
    """A user's role inside one tenant."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=[(r, r.title()) for r in HUMAN_ROLES], default=Role.AGENT)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "tenant"], name="one_membership_per_tenant")]


class ApiToken(models.Model):
    """A per-tenant API token. Only ``prefix`` (lookup) and the SHA-256 ``digest`` are stored.

    ``bot``: the one bot id a role-``bot`` token may act as on ``…/bots/{bot}/…`` (null for other roles;
    a bot token without one, from before migration 0005 with a name that is no bot id, acts as no bot).
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64)
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.ADMIN)
    bot = models.CharField(max_length=63, null=True, blank=True, help_text="the bot a bot-role token acts as")
    created_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]


class LastTenant(models.Model):
    """The tenant a user last opened a page of: where their next login lands (kept across logins)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True, related_name="last_tenant"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    opened_at = models.DateTimeField(auto_now=True)
