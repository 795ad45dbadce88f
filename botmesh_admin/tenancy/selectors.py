"""Reads of tenants, memberships and tokens. Lookups answer "not found" for foreign objects."""

from __future__ import annotations

import hashlib
import hmac
import logging

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.utils import timezone

from botmesh_admin.errors import NotFound
from botmesh_admin.kv.tenant import RESERVED_TENANT_IDS, validate_tenant_id

from .models import ApiToken, LastTenant, Membership, Tenant
from .principal import Principal, token_of_agent

log = logging.getLogger("botmesh.tenancy")


def tenant_ids() -> list[str]:
    """Return the ids of every tenant whose tables can be read, sorted; for loops over all tenants.

    A tenant created by an earlier version under an id that is now reserved
    (``RESERVED_TENANT_IDS``: the kernel's own namespaces) is left out with a
    warning: its tables cannot be named any more (``TenantKv.table`` refuses
    the id), and one such tenant must not stop the loop for every other one.
    ``manage.py botmesh_upgrade`` says what to do with it.
    """
    ids = sorted(Tenant.objects.values_list("id", flat=True))
    skipped = [t for t in ids if t in RESERVED_TENANT_IDS]
    if skipped:
        log.warning("tenants %s have reserved ids and are skipped; see manage.py botmesh_upgrade", skipped)
    return [t for t in ids if t not in RESERVED_TENANT_IDS]


def token_digest(plaintext: str) -> str:
    """Return the hex SHA-256 of a token (tokens are 256-bit random, so no slow hash is needed)."""
    return hashlib.sha256(plaintext.encode("utf-8")).hexdigest()


def tenant_list_for_user(user: AbstractBaseUser | AnonymousUser) -> list[Tenant]:
    """Return the tenants ``user`` belongs to (every tenant for a superuser)."""
    if not user.is_authenticated:
        return []
    if user.is_superuser:
        return list(Tenant.objects.all())
    return list(Tenant.objects.filter(memberships__user=user).distinct())


def first_joined_tenant(user: AbstractBaseUser | AnonymousUser) -> str | None:
    """Return the id of the tenant ``user`` joined first (membership order; the oldest tenant for a
    superuser who is a member of none), or ``None`` if they have none."""
    if not user.is_authenticated:
        return None
    first = Membership.objects.filter(user=user).order_by("id").values_list("tenant_id", flat=True).first()
    if first is None and user.is_superuser:
        first = Tenant.objects.order_by("created_at", "id").values_list("id", flat=True).first()
    return first


def tenant_time_zone(tenant: str) -> str:
    """Return the IANA zone name the tenant's pages show times in, or ``""`` while none is chosen (UTC)."""
    return Tenant.objects.filter(id=tenant).values_list("time_zone", flat=True).first() or ""


def last_opened_tenant(user: AbstractBaseUser | AnonymousUser) -> str | None:
    """Return the id of the tenant ``user`` last opened a page of (any earlier login), or ``None``."""
    if not user.is_authenticated:
        return None
    return LastTenant.objects.filter(user_id=user.pk).values_list("tenant_id", flat=True).first()


def first_tenant_with_data(user: AbstractBaseUser | AnonymousUser, tenants: list[str]) -> str | None:
    """Return the first of ``tenants`` (in the order given) holding conversations or contacts, or ``None``.

    Two counter reads per tenant (O(1) each: the inbox's and the CRM's count indexes).
    """
    from crm.selectors import contact_count
    from inbox.selectors import conversation_count

    agent = user.get_username() or "nobody"
    for tenant in tenants:
        if conversation_count(tenant, agent=agent) or contact_count(tenant):
            return tenant
    return None


def principal_for_user(user: AbstractBaseUser | AnonymousUser, tenant: str) -> Principal:
    """Return the user's principal in ``tenant``; raise ``NotFound`` if not a member (or no tenant).

    An id no tenant can have (``BAD!``: the format) or a reserved one (the kernel's namespaces, even if
    an installation of an earlier version has a tenant row with it) is a ``ValidationError`` on field
    ``tenant`` (422), before any lookup.
    """
    validate_tenant_id(tenant, "tenant")  # a malformed or reserved id: 422 saying the format, not 404
    if not user.is_authenticated:
        raise NotFound(f"tenant {tenant!r} not found")
    if user.is_superuser:
        if not Tenant.objects.filter(id=tenant).exists():
            raise NotFound(f"tenant {tenant!r} not found")
        return Principal(tenant=tenant, role="admin", actor=f"user:{user.get_username()}", user_id=user.pk)
    membership = Membership.objects.filter(user=user, tenant_id=tenant).first()
    if membership is None:
        raise NotFound(f"tenant {tenant!r} not found")
    return Principal(tenant=tenant, role=membership.role, actor=f"user:{user.get_username()}", user_id=user.pk)


def principal_for_token(plaintext: str, tenant: str) -> Principal | None:
    """Return the principal of a live token, or ``None`` if the token is unknown or revoked.

    Raise ``NotFound`` if the token is valid but belongs to another tenant:
    a token of tenant A asking for tenant B's objects gets 404, never their data.
    """
    validate_tenant_id(tenant, "tenant")  # a malformed or reserved id: 422 saying the format, not 404
    parts = plaintext.split("_")
    if len(parts) != 3 or parts[0] != "bm":
        return None
    token = ApiToken.objects.filter(prefix=parts[1], revoked_at__isnull=True).first()
    if token is None or not hmac.compare_digest(token.digest, token_digest(plaintext)):
        return None
    if token.tenant_id != tenant:
        raise NotFound(f"tenant {tenant!r} not found")
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return Principal(tenant=tenant, role=token.role, actor=f"token:{token.name}", token_id=token.pk, bot=token.bot)


def token_name(tenant: str, token_id: int) -> str | None:
    """Return the name of the tenant's token ``token_id`` (revoked ones too), or ``None`` if it has none such."""
    return ApiToken.objects.filter(tenant_id=tenant, pk=token_id).values_list("name", flat=True).first()


def agent_label(tenant: str, agent_id: str) -> str:
    """Return how pages and API name an agent id: a username as it is, a token's ``token-<id>`` as ``token:<name>``.

    ``token-<id>`` is the agent id an API token acts as in the inbox
    (``principal.token_agent``); its name is what ``/whoami`` and the audit
    log say (``token:<name>``, revoked tokens too). A token id the tenant has
    no token for stays as it is. One indexed query per token id named.
    """
    token_id = token_of_agent(agent_id)
    name = None if token_id is None else token_name(tenant, token_id)
    return agent_id if name is None else f"token:{name}"


def token_list(tenant: str) -> list[ApiToken]:
    """Return the tenant's tokens, newest first (revoked ones included)."""
    return list(ApiToken.objects.filter(tenant_id=tenant))
