"""``/api/v1/tenants/{tenant}/`` — who am I, and token management (admins only)."""

from __future__ import annotations

from datetime import datetime

from django.http import HttpRequest
from ninja import Field, Router, Schema, Status

from botmesh_admin.api import BodyIn, ErrorOut, one_of, principal, requires
from botmesh_admin.errors import NotFound, ValidationError, bounded
from botmesh_admin.validation import ascii_digits

from . import selectors, services

router = Router(tags=["tenancy"])


class WhoAmIOut(Schema):
    tenant: str
    role: str
    actor: str


class TokenIn(BodyIn):
    name: str
    role: str = one_of(("admin", "agent", "bot"), "admin")
    bot: str | None = Field(None, description="role bot: the one bot id the token acts as (default: name)")


class TokenOut(Schema):
    id: int
    name: str
    role: str
    bot: str | None = None
    prefix: str
    created_by: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


class TokenCreatedOut(TokenOut):
    token: str


@router.get("whoami", response={200: WhoAmIOut})
@requires("member")
def whoami(request: HttpRequest, tenant: str) -> WhoAmIOut:
    """Return the caller's tenant, role and actor name."""
    p = principal(request)
    return WhoAmIOut(tenant=p.tenant, role=p.role, actor=p.actor)


class TenantEraseIn(BodyIn):
    confirm: str


class TenantEraseOut(Schema):
    tenant: str
    removed: dict[str, int]


@router.post("erase", response={200: TenantEraseOut, 403: ErrorOut, 422: ErrorOut})
@requires("admin")
def tenant_erase(request: HttpRequest, tenant: str, body: TenantEraseIn) -> TenantEraseOut:
    """Erase the tenant for good (admins only): ``confirm`` must repeat the tenant id.

    Everything goes — every package's records, the journal, traces, metrics,
    tokens (this one too), channels and memberships; ``removed`` counts them.
    An interrupted erasure is finished by ``manage.py botmesh_tenant erase``.
    """
    if body.confirm != tenant:
        raise ValidationError("confirm", "type the tenant id to confirm the erasure")
    removed = services.tenant_erase(tenant)
    request.principal = None  # type: ignore[attr-defined]  # this request's trace is filed under no tenant
    return TenantEraseOut(tenant=tenant, removed=removed)


@router.get("tokens", response={200: list[TokenOut], 403: ErrorOut})
@requires("admin")
def token_list(request: HttpRequest, tenant: str) -> list[TokenOut]:
    """List the tenant's API tokens (admins only)."""
    return [TokenOut.from_orm(t) for t in selectors.token_list(tenant)]


@router.post("tokens", response={201: TokenCreatedOut, 403: ErrorOut, 422: ErrorOut})
@requires("admin")
def token_create(request: HttpRequest, tenant: str, body: TokenIn) -> Status:
    """Create a token; the plaintext ``token`` is returned once and never stored."""
    p = principal(request)
    token, plaintext = services.token_create(tenant, name=body.name, role=body.role, created_by=p.actor, bot=body.bot)
    out = TokenCreatedOut(**TokenOut.from_orm(token).dict(), token=plaintext)
    return Status(201, out)


@router.delete("tokens/{token_id}", response={200: TokenOut, 403: ErrorOut, 404: ErrorOut})
@requires("admin")
def token_revoke(request: HttpRequest, tenant: str, token_id: str) -> TokenOut:
    """Revoke a token (admins only). An id no token can have (``abc``) is 404, as an id of none is (README)."""
    if not ascii_digits(token_id):
        raise NotFound(f"token {bounded(token_id, 60)} not found")
    return TokenOut.from_orm(services.token_revoke(tenant, token_id=int(token_id)))
