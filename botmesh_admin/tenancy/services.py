"""Writes of tenants, memberships and tokens."""

from __future__ import annotations

import secrets

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from botmesh_admin.errors import NotFound, ValidationError
from botmesh_admin.kv.tenant import validate_tenant_id

from .models import HUMAN_ROLES, ApiToken, Membership, Role, Tenant
from .selectors import token_digest


def tenant_create(tenant: str, *, name: str, default_region: str = "CO") -> Tenant:
    """Create (or update the name of) a tenant; raise ``ValidationError`` for a bad or reserved id.

    Reserved ids (``kv.tenant.RESERVED_TENANT_IDS``: ``system`` …) name the kernel's own
    tables and journal records, so no tenant may take one.
    """
    validate_tenant_id(tenant, "tenant.id")
    if not name or len(name) > 200:
        raise ValidationError("tenant.name", "must be 1-200 characters")
    if len(default_region) != 2 or not default_region.isalpha():
        raise ValidationError("tenant.default_region", "must be a two-letter ISO 3166 region")
    obj, _ = Tenant.objects.update_or_create(
        id=tenant, defaults={"name": name, "default_region": default_region.upper()}
    )
    return obj


def membership_set(tenant: str, *, username: str, role: str) -> Membership:
    """Give ``username`` the ``role`` (agent or admin) in ``tenant``."""
    if role not in HUMAN_ROLES:
        raise ValidationError("membership.role", f"must be one of {', '.join(HUMAN_ROLES)}")
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise NotFound(f"user {username!r} not found")
    if not Tenant.objects.filter(id=tenant).exists():
        raise NotFound(f"tenant {tenant!r} not found")
    membership, _ = Membership.objects.update_or_create(
        user=user, tenant_id=tenant, defaults={"role": role}
    )
    return membership


def token_create(tenant: str, *, name: str, role: str = "admin", created_by: str = "") -> tuple[ApiToken, str]:
    """Create an API token; return ``(token, plaintext)``. The plaintext is shown once, never stored."""
    name = (name or "").strip()
    if not name or len(name) > 100:
        raise ValidationError("token.name", "must be 1-100 characters")
    if role not in Role.values:
        raise ValidationError("token.role", f"must be one of {', '.join(Role.values)}")
    if not Tenant.objects.filter(id=tenant).exists():
        raise NotFound(f"tenant {tenant!r} not found")
    prefix = secrets.token_hex(6)
    plaintext = f"bm_{prefix}_{secrets.token_urlsafe(32).replace('_', 'x')}"
    with transaction.atomic():
        token = ApiToken.objects.create(
            tenant_id=tenant, name=name, prefix=prefix, digest=token_digest(plaintext), role=role,
            created_by=created_by,
        )
    return token, plaintext


def token_revoke(tenant: str, *, token_id: int) -> ApiToken:
    """Revoke a token of ``tenant``; a token of another tenant is ``NotFound``."""
    token = ApiToken.objects.filter(tenant_id=tenant, pk=token_id).first()
    if token is None:
        raise NotFound(f"token {token_id} not found")
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token
