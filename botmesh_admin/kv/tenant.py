"""Tenant-scoped table names over a DurableKv (ARCHITECTURE §4, "Tenant-kv").

Packages never build table names by hand: ``TenantKv(kv, "crm").table(tenant,
"contacts")`` returns ``"crm/<tenant>/contacts"`` after checking both ids
against ``^[a-z0-9][a-z0-9_-]{0,62}$``, so no input can name another tenant's
table. There is deliberately no call that reads across tenants.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from botmesh_admin.errors import BadType, ValidationError

from .base import DurableKv

ID_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


def validate_id(value: object, field: str) -> str:
    """Return ``value`` if it matches the tenant/collection id rule, else raise ``ValidationError``."""
    if not isinstance(value, str):
        raise BadType(field, f"must be a string, not {type(value).__name__}")
    if not ID_RE.fullmatch(value):
        raise ValidationError(
            field, "must be 1-63 characters of a-z, 0-9, '_' or '-', starting with a letter or digit"
        )
    return value


class TenantKv:
    """Table names for one package: ``"<package>/<tenant>/<collection>"``."""

    def __init__(self, kv: DurableKv, package: str) -> None:
        self.kv = kv
        self.package = validate_id(package, "package")

    def table(self, tenant: str, collection: str) -> str:
        """Return the table name of ``collection`` for ``tenant`` (both ids validated)."""
        return (
            f"{self.package}/{validate_id(tenant, 'tenant')}/{validate_id(collection, 'collection')}"
        )

    def tables(self, tenant: str, collections: Iterable[str]) -> dict[str, str]:
        """Return ``{collection: table name}`` for ``tenant``."""
        return {c: self.table(tenant, c) for c in collections}

    def drop_tenant(self, tenant: str, collections: Iterable[str]) -> None:
        """Drop every listed collection of ``tenant`` (tenant erasure)."""
        for name in self.tables(tenant, collections).values():
            self.kv.drop(name)
