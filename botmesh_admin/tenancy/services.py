"""Writes of tenants, memberships and tokens, and tenant erasure."""

from __future__ import annotations

import secrets
from collections.abc import Callable

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from botmesh_admin.errors import NotFound, StoreUnavailable, ValidationError
from botmesh_admin.kv.tenant import validate_tenant_id
from botmesh_admin.validation import validate_text

from .models import HUMAN_ROLES, ApiToken, LastTenant, Membership, Role, Tenant
from .principal import TOKEN_AGENT_RE
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


def tenant_time_zone_set(tenant: str, *, time_zone: str, only_if_unset: bool = False) -> bool:
    """Set the IANA zone (``America/Bogota``) the tenant's pages show times in; return whether it changed.

    ``only_if_unset``: set it only while the tenant has none yet (the browser's
    zone on first use must not overwrite an admin's choice). Raises
    ``ValidationError`` on ``time_zone`` for a name the zone database does not
    know, ``NotFound`` for an unknown tenant.
    """
    from botmesh_admin.timefmt import zone_or_none

    if zone_or_none(time_zone) is None:
        raise ValidationError("time_zone", "is not a time zone name like America/Bogota or UTC")
    rows = Tenant.objects.filter(id=tenant)
    if not rows.exists():
        raise NotFound(f"tenant {tenant!r} not found")
    if only_if_unset:
        rows = rows.filter(time_zone="")
    return rows.exclude(time_zone=time_zone).update(time_zone=time_zone) > 0


def membership_set(tenant: str, *, username: str, role: str) -> Membership:
    """Give ``username`` the ``role`` (agent or admin) in ``tenant``.

    Raise ``ValidationError`` for another role, or a username of the form
    ``token-<number>`` (the id an API token acts as: its notes, handoffs and
    read markers would be the member's); ``NotFound`` for no such user or tenant.
    """
    if role not in HUMAN_ROLES:
        raise ValidationError("membership.role", f"must be one of {', '.join(HUMAN_ROLES)}")
    if TOKEN_AGENT_RE.fullmatch(username):
        raise ValidationError("membership.username", "token-<number> is the name API tokens act as; choose another")
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise NotFound(f"user {username!r} not found")
    if not Tenant.objects.filter(id=tenant).exists():
        raise NotFound(f"tenant {tenant!r} not found")
    membership, _ = Membership.objects.update_or_create(user=user, tenant_id=tenant, defaults={"role": role})
    return membership


def last_tenant_set(user_id: int, *, tenant: str) -> None:
    """Remember ``tenant`` as the one user ``user_id`` opened last (where their next login lands).

    The caller has checked that the user may open it (``tenant_page``); a
    tenant erased later takes its row along (the login then falls back).
    """
    LastTenant.objects.update_or_create(user_id=user_id, defaults={"tenant_id": tenant})


def token_create(
    tenant: str, *, name: str, role: str = "admin", created_by: str = "", bot: str | None = None
) -> tuple[ApiToken, str]:
    """Create an API token; return ``(token, plaintext)``. The plaintext is shown once, never stored.

    A role-``bot`` token is bound to one bot id, ``bot`` (default: ``name``): it may act only as that bot
    on ``…/bots/{bot}/…`` (``Principal.require_bot``). Raise ``ValidationError`` on ``token.bot`` for a bot
    id that is not 1-63 characters of text, or a ``bot`` given for another role.

    Raise ``ValidationError`` on ``token.name`` for a name that is blank, over 100 characters, or holds a
    control character or an invisible format character (``botmesh_admin.validation.SPOOFING_RE``: the name
    is shown on Settings and in audit trails as ``token:<name>``), on ``token.role`` for an unknown role.
    """
    name = (name or "").strip()
    if not name or len(name) > 100:
        raise ValidationError("token.name", "must be 1-100 characters")
    validate_text(name, "token.name", max_len=100, blank=True, allowed_controls="")
    if role not in Role.values:
        raise ValidationError("token.role", f"must be one of {', '.join(Role.values)}")
    if role == Role.BOT:
        from botmesh_admin.observability.domain import validate_bot_id

        bot = validate_bot_id(name if bot is None else bot, "token.bot")
    elif bot is not None:
        raise ValidationError("token.bot", "only a token of role bot is bound to a bot")
    if not Tenant.objects.filter(id=tenant).exists():
        raise NotFound(f"tenant {tenant!r} not found")
    prefix = secrets.token_hex(6)
    plaintext = f"bm_{prefix}_{secrets.token_urlsafe(32).replace('_', 'x')}"
    with transaction.atomic():
        token = ApiToken.objects.create(
            tenant_id=tenant,
            name=name,
            prefix=prefix,
            digest=token_digest(plaintext),
            role=role,
            bot=bot,
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


JOURNAL_ERASE_BATCH = 1000


def _kv_packages() -> list[str]:
    """Return the package names whose Kv tables may hold a tenant's data.

    Every app with a Kv store (``<app>.stores.kv``, where ``TenantKv(kv, <label>)``
    lives) and every declared indexed collection. Listing a prefix costs a pass over
    the keyspace on Redis, so the list is kept to those.
    """
    import importlib.util

    from django.apps import apps

    from botmesh_admin.kv.indexes import declared

    names = {c.package for c in declared()}  # imports every app's stores.kv (and its erasers)
    for config in apps.get_app_configs():
        try:
            if importlib.util.find_spec(f"{config.name}.stores.kv") is not None:
                names.add(config.label)
        except ModuleNotFoundError:
            continue
    return sorted(names)


def tenant_erase(tenant: str, *, progress: Callable[[str], None] | None = None) -> dict[str, int]:
    """Delete everything of ``tenant``; return ``{what: how many removed}``.

    In this order, each step idempotent, so a killed erasure is finished by
    running it again (also once the tenant row is gone):

    1. its channels, API tokens and memberships (one transaction): no webhook,
       token or member reaches the tenant any more;
    2. its event journal records, a batch at a time;
    3. every Kv table of every package (``<package>/<tenant>/…``: records,
       declared indexes, campaign delivery tables, traces, metrics samples) and
       what packages keep of it in kernel tables (``kv.tenant.on_tenant_erase``);
    4. the tenant row, then the Kv tables once more (what work in flight wrote
       meanwhile).

    ``progress`` gets one line per step. Raise ``ValidationError`` for a
    reserved or malformed id (the kernel's namespaces are never erased) and
    ``StoreUnavailable`` if a journal cannot erase by tenant.
    """
    from botmesh_admin.channels.models import ChannelConfig
    from botmesh_admin.channels.selectors import channel_config_forget
    from botmesh_admin.events import default_journal
    from botmesh_admin.events.base import TenantErasure
    from botmesh_admin.kv.runtime import default_kv
    from botmesh_admin.kv.tenant import tenant_erasers, tenant_tables
    from botmesh_admin.observability import tracing

    validate_tenant_id(tenant, "tenant")
    say = progress or (lambda line: None)
    removed: dict[str, int] = {}
    with transaction.atomic():
        removed["channels"] = ChannelConfig.objects.filter(tenant_id=tenant).delete()[0]
        removed["api tokens"] = ApiToken.objects.filter(tenant_id=tenant).delete()[0]
        removed["memberships"] = Membership.objects.filter(tenant_id=tenant).delete()[0]
    channel_config_forget(tenant)  # the webhooks' cached configuration (this process; others expire theirs)
    say(
        f"{removed['channels']} channels, {removed['api tokens']} API tokens, "
        f"{removed['memberships']} memberships removed"
    )

    journal = default_journal()
    if not isinstance(journal, TenantErasure):
        raise StoreUnavailable(f"{type(journal).__name__} cannot erase a tenant's records")
    removed["journal records"] = 0
    while gone := journal.erase_tenant(tenant, limit=JOURNAL_ERASE_BATCH):
        removed["journal records"] += gone
        say(f"journal: {removed['journal records']} records removed")

    kv, packages = default_kv(), _kv_packages()
    removed["kv tables"] = 0
    for final in (False, True):
        for table in tenant_tables(kv, tenant, packages):
            kv.drop(table)
            removed["kv tables"] += 1
            say(f"kv: dropped {table}")
        for name, eraser in tenant_erasers().items():
            removed[name] = removed.get(name, 0) + eraser(kv, tenant)
        if not final:
            removed["tenant"] = Tenant.objects.filter(id=tenant).delete()[1].get(Tenant._meta.label, 0)
            tracing.force_flush()  # traces of the tenant this process still holds: written now, dropped next
    say("; ".join(f"{what}: {n}" for what, n in removed.items()))
    return removed
