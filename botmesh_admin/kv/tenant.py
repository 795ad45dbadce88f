"""Tenant-scoped table names over a DurableKv (ARCHITECTURE §4, "Tenant-kv").

Packages never build table names by hand: ``TenantKv(kv, "crm").table(tenant,
"contacts")`` returns ``"crm/<tenant>/contacts"`` after checking both ids
against ``^[a-z0-9][a-z0-9_-]{0,62}$``, so no input can name another tenant's
table. There is deliberately no call that reads across tenants.

The kernel's own namespaces — the rule
--------------------------------------

The kernel keeps tables that belong to no tenant (the scheduler's jobs and
fences, the campaigns' cross-tenant due-index, traces of no tenant, process
counters). No tenant id may ever name one of them:

- New kernel tables live under a namespace that starts with ``~``:
  ``TenantKv(kv, "campaigns").kernel_table("system", "index")`` is
  ``"campaigns/~system/index"``. ``~`` is outside the tenant id alphabet, so
  no tenant id can reach these tables, whatever the package.
- ``RESERVED_TENANT_IDS`` are ids the kernel used as pseudo-tenants before that
  rule (``system``: the ``coordination/system/jobs`` and
  ``coordination/system/fences`` tables, the event journal's records of
  scheduled-job occurrences, and the campaigns index of earlier versions,
  ``campaigns/system/index``), plus the bare names of the ``~`` namespaces. They
  are refused as tenant ids (``validate_tenant_id``: by ``botmesh_tenant
  create``, ``tenancy.services.tenant_create`` and ``TenantKv.table``), with an
  error naming the field. The kernel reaches its legacy tables through
  ``TenantKv.reserved_table``, which accepts nothing else.
- ``validate_id`` alone (the id *syntax*) still accepts them: the journal
  stores the scheduler's records under tenant ``system``.

Tenant erasure
--------------

Every table of a tenant is ``<package>/<tenant>/<collection>``, so
``tenant_tables`` finds them all by prefix (``TableListing``), whatever the
collection. What a package keeps of a tenant in a kernel table (the campaigns'
due-index) it erases itself through ``on_tenant_erase``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from botmesh_admin.errors import BadType, ValidationError

from .base import DurableKv, TableListing

ID_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
KERNEL_MARK = "~"
"""First character of every kernel namespace in a table name (never in an id)."""
RESERVED_TENANT_IDS = frozenset({"system", "process", "kernel"})
"""Ids no tenant may take: kernel pseudo-tenants of earlier versions and the bare ``~`` names."""


def validate_id(value: object, field: str) -> str:
    """Return ``value`` if it matches the tenant/collection id rule, else raise ``ValidationError``."""
    if not isinstance(value, str):
        raise BadType(field, f"must be a string, not {type(value).__name__}")
    if not ID_RE.fullmatch(value):
        raise ValidationError(field, "must be 1-63 characters of a-z, 0-9, '_' or '-', starting with a letter or digit")
    return value


def validate_tenant_id(value: object, field: str = "tenant") -> str:
    """Return ``value`` if it may be a tenant's id; raise ``ValidationError`` naming ``field``.

    On top of ``validate_id``, refuse ``RESERVED_TENANT_IDS`` (the kernel's own
    namespaces; see the module docstring).
    """
    if isinstance(value, str) and not ID_RE.fullmatch(value):
        # Name the id: "tenant: must be …" alone does not say which of a request's names was malformed.
        raise ValidationError(
            field,
            f"{value[:80]!r} is not a tenant id: it must be 1-63 characters of a-z, 0-9, '_' or '-', "
            "starting with a letter or digit",
        )
    validate_id(value, field)
    if value in RESERVED_TENANT_IDS:
        raise ValidationError(
            field,
            f"{value!r} is reserved for the kernel's own tables (reserved: {', '.join(sorted(RESERVED_TENANT_IDS))})",
        )
    return str(value)


class TenantKv:
    """Table names for one package: ``"<package>/<tenant>/<collection>"``."""

    def __init__(self, kv: DurableKv, package: str) -> None:
        self.kv = kv
        self.package = validate_id(package, "package")

    def table(self, tenant: str, collection: str) -> str:
        """Return the table name of ``collection`` for ``tenant`` (both ids validated, reserved ids refused)."""
        return f"{self.package}/{validate_tenant_id(tenant, 'tenant')}/{validate_id(collection, 'collection')}"

    def kernel_table(self, namespace: str, collection: str) -> str:
        """Return ``"<package>/~<namespace>/<collection>"``: a kernel table no tenant id can name."""
        return (
            f"{self.package}/{KERNEL_MARK}{validate_id(namespace, 'namespace')}/{validate_id(collection, 'collection')}"
        )

    def reserved_table(self, namespace: str, collection: str) -> str:
        """Return ``"<package>/<namespace>/<collection>"`` for a kernel table of an earlier version.

        ``namespace`` must be one of ``RESERVED_TENANT_IDS`` (raise ``ValidationError``
        otherwise), so this never names a tenant's table.
        """
        if namespace not in RESERVED_TENANT_IDS:
            raise ValidationError("namespace", f"{namespace!r} is not a reserved kernel namespace")
        return f"{self.package}/{namespace}/{validate_id(collection, 'collection')}"

    def tables(self, tenant: str, collections: Iterable[str]) -> dict[str, str]:
        """Return ``{collection: table name}`` for ``tenant``."""
        return {c: self.table(tenant, c) for c in collections}

    def drop_tenant(self, tenant: str, collections: Iterable[str]) -> None:
        """Drop every listed collection of ``tenant`` (tenant erasure)."""
        for name in self.tables(tenant, collections).values():
            self.kv.drop(name)


TenantEraser = Callable[[DurableKv, str], int]
_erasers: dict[str, TenantEraser] = {}


def on_tenant_erase(name: str, eraser: TenantEraser) -> None:
    """Register ``eraser(kv, tenant) -> removed`` for what a package keeps of a tenant in a kernel table.

    ``name`` says what it erases in the erasure's report; registering a name again replaces it.
    """
    _erasers[name] = eraser


def tenant_erasers() -> dict[str, TenantEraser]:
    """Return the registered erasers by name (each app's ``stores.kv`` registers its own on import)."""
    return dict(sorted(_erasers.items()))


def tenant_tables(kv: DurableKv, tenant: str, packages: Iterable[str]) -> list[str]:
    """Return every table of ``tenant`` in ``packages`` that holds a live entry, by name.

    Raise ``ValidationError`` for a reserved or malformed tenant id, and
    ``TypeError`` if ``kv`` cannot list its tables (every shipped backend can).
    """
    validate_tenant_id(tenant, "tenant")
    if not isinstance(kv, TableListing):
        raise TypeError(f"{type(kv).__name__} cannot list its tables")
    return sorted({t for package in packages for t in kv.tables(f"{validate_id(package, 'package')}/{tenant}/")})
