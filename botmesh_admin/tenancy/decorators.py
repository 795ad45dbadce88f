"""Tenancy for admin pages, enforced in one place (NetBox style).

Every tenant page is ``/t/<tenant>/…`` and is wrapped in ``@tenant_page(role)``:
the user must be logged in and a member of the tenant (else 404, never 403 for a
foreign tenant); ``request.principal`` is then set, and the tenant's time
zone is active while the view runs (``botmesh_admin.timefmt``). A ``DomainError`` raised by a
service renders as an error page (or an htmx fragment) with its status; a
``ValidationError`` of an id the address carries (``/plugins/bogus/``: field
``plugin_id``) is the 404 page, since a mistyped address names nothing rather
than a form the user filled in wrongly.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from botmesh_admin.errors import BadRequest, DomainError, NotFound, ValidationError, bounded
from botmesh_admin.timefmt import zone_or_none

from .principal import Principal
from .selectors import principal_for_user, tenant_time_zone

View = Callable[..., HttpResponse]


def tenant_page(role: str = "agent") -> Callable[[View], View]:
    """Decorate a view taking ``tenant`` so it runs only for members with ``role`` or above."""

    def decorator(view: View) -> View:
        @functools.wraps(view)
        def wrapper(request: HttpRequest, tenant: str, *args: Any, **kwargs: Any) -> HttpResponse:
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            try:
                principal = principal_for_user(request.user, tenant)
                request.principal = principal  # type: ignore[attr-defined]
                principal.require(role)
                _remember_tenant(request, tenant)
                # Every time the page shows is in the tenant's zone (UTC until one is chosen).
                zone_name = tenant_time_zone(tenant)
                request.tenant_time_zone = zone_name  # type: ignore[attr-defined]  # "": not chosen yet
                with timezone.override(zone_or_none(zone_name)):
                    return view(request, tenant, *args, **kwargs)
            except ValidationError as exc:
                if exc.field in kwargs:
                    return render_error(request, address_not_found(exc.field, kwargs[exc.field]))
                return render_error(request, exc)
            except DomainError as exc:
                return render_error(request, exc)

        return wrapper

    return decorator


LAST_TENANT = "botmesh_last_tenant"
REMEMBER_EVERY_S = 300


def _remember_tenant(request: HttpRequest, tenant: str) -> None:
    """Keep ``tenant`` as the one the user opened last: in the session, and for later logins.

    Only pages a person opens count (GET, not an htmx poll); the database row
    (``LastTenant``) is written when the tenant changes and at most every
    ``REMEMBER_EVERY_S`` seconds otherwise, so another browser's later choice
    is overwritten by this one's only while it is in use.
    """
    if request.method != "GET" or request.headers.get("HX-Request"):
        return
    import time

    from .services import last_tenant_set

    now = int(time.time())
    session = request.session
    if session.get(LAST_TENANT) == tenant and now - int(session.get(LAST_TENANT + "_at", 0)) < REMEMBER_EVERY_S:
        return
    session[LAST_TENANT] = tenant
    session[LAST_TENANT + "_at"] = now
    last_tenant_set(request.user.pk, tenant=tenant)


def address_not_found(name: str, value: object) -> NotFound:
    """Return the 404 of the address parameter ``name`` (``plugin_id``) whose ``value`` is not even an id.

    Its message reads like the stores' (``plugin bogus not found``), so the page says "This plugin does not exist."
    """
    what = name.removesuffix("_id").replace("_", " ")
    return NotFound(f"{what} {bounded(str(value), 60)} not found")


@tenant_page("agent")
def page_missing(request: HttpRequest, tenant: str, rest: str = "") -> HttpResponse:
    """``/t/<tenant>/<anything no route matches>``: the app's 404 page (Django's debug page is for developers).

    Mounted last. A GET or HEAD of an address without its final slash that names
    a page with one is redirected to it (301), as ``CommonMiddleware``'s
    ``APPEND_SLASH`` would do if this catch-all did not match every address.
    Another method (a POST) is not redirected — a 301 makes the browser repeat it
    as a GET, without its form data — but answered with the 404 page naming the
    address with the slash.
    """
    from django.conf import settings
    from django.http import HttpResponsePermanentRedirect
    from django.urls import Resolver404, resolve

    if settings.APPEND_SLASH and not request.path_info.endswith("/"):
        try:
            match = resolve(request.path_info + "/")
        except Resolver404:
            match = None
        if match is not None and match.url_name != "page-missing":
            if request.method not in ("GET", "HEAD"):
                raise NotFound(
                    f"page not found: send the {request.method} to {request.path}/ (with the final slash);"
                    " it is not redirected, since a redirect would drop its data"
                )
            query = request.META.get("QUERY_STRING", "")
            return HttpResponsePermanentRedirect(request.path + "/" + (f"?{query}" if query else ""))
    raise NotFound("page not found")


def render_error(request: HttpRequest, exc: DomainError) -> HttpResponse:
    """Render a domain error as a page, or as a fragment for htmx requests."""
    template = "_error.html" if request.headers.get("HX-Request") else "error.html"
    return render(request, template, {"error": exc}, status=exc.status)


def page_principal(request: HttpRequest) -> Principal:
    """Return the principal that ``tenant_page`` set."""
    principal = getattr(request, "principal", None)
    if principal is None:
        raise NotFound("no tenant")
    return principal


@contextlib.contextmanager
def list_query_checked() -> Iterator[None]:
    """Turn a list selector's ``ValidationError`` into a ``BadRequest`` (a 400 page naming the field).

    A list page's filters and cursor come from its address, not from a form
    the user typed into: a value outside the choices (``?status=bogus``) or a
    cursor that is not one (``?after=garbage``) is a bad link, refused rather
    than answered with an unfiltered or empty list as if it were valid.
    """
    try:
        yield
    except ValidationError as exc:
        raise BadRequest(f"{exc.message} (remove it from the address to see the whole list)", field=exc.field) from None
