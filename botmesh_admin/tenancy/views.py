"""Login (with a failed-attempt limit), tenant switching and API token pages."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from botmesh_admin import confirmation
from botmesh_admin.errors import DomainError, NotFound, ValidationError
from botmesh_admin.formerrors import form_error
from botmesh_admin.kv.tenant import ID_RE

from . import selectors, services, throttle
from .decorators import LAST_TENANT, page_principal, render_error, tenant_page

NEW_TOKEN = "botmesh_new_token"


class LoginView(auth_views.LoginView):
    """Django's login view, refusing a user name that failed too often (HTTP 429)."""

    template_name = "registration/login.html"
    redirect_authenticated_user = True

    def post(self, request: HttpRequest, *args, **kwargs) -> HttpResponse:  # type: ignore[override]
        username = request.POST.get("username", "")
        if username and throttle.login_locked(username):
            form = self.get_form()
            form.errors.clear()
            return render(
                request,
                self.template_name,
                {"form": form, "locked": True},
                status=429,
            )
        return super().post(request, *args, **kwargs)

    def form_invalid(self, form):  # type: ignore[no-untyped-def]
        username = self.request.POST.get("username", "")
        if username:
            throttle.login_failed(username)
        return super().form_invalid(form)

    def form_valid(self, form):  # type: ignore[no-untyped-def]
        throttle.login_succeeded(form.get_user().get_username())
        return super().form_valid(form)


@login_required
def home(request: HttpRequest) -> HttpResponse:
    """Send the user to a tenant of theirs, or explain that they have none.

    The tenant last opened in this session, else the one they last opened in
    an earlier login (``LastTenant``, written by ``tenant_page``), else — a
    first login — the first tenant holding data in the order they joined (the
    demo's ``tienda``: ``demo.ensure_accounts`` adds the demo users to it
    first), else the one they joined first, not the first by id (the
    switcher's order). A superuser, member of none, goes to the oldest tenant.
    """
    tenants = selectors.tenant_list_for_user(request.user)
    if tenants:
        ids = {t.id for t in tenants}
        for last in (request.session.get(LAST_TENANT), selectors.last_opened_tenant(request.user)):
            if last in ids:
                return redirect("tenant-home", tenant=last)
        first = selectors.first_joined_tenant(request.user)
        joined = [first] if first else []
        order = joined + [t.id for t in tenants if t.id != first]
        chosen = selectors.first_tenant_with_data(request.user, order) or first or tenants[0].id
        return redirect("tenant-home", tenant=chosen)
    return render(request, "no_tenant.html")


@login_required
def switch_tenant(request: HttpRequest) -> HttpResponse:
    """Go to the tenant chosen in the switcher (a GET form, so it works without JavaScript)."""
    tenant = request.GET.get("tenant", "")
    if not tenant or not ID_RE.fullmatch(tenant):
        return redirect("home")
    return redirect("tenant-home", tenant=tenant)


@tenant_page("agent")
def tenant_home(request: HttpRequest, tenant: str) -> HttpResponse:
    """The tenant's overview: one card per package with its headline number."""
    from botmesh_admin.dashboard.overview import tenant_overview

    cards = tenant_overview(tenant, principal=page_principal(request))
    return render(request, "tenancy/home.html", {"tenant": tenant, "cards": cards})


TOKEN_FIELDS = {"token.name": "name", "token.role": "role"}
"""The token form's inputs by the domain field path a refusal names (``botmesh_admin.formerrors``)."""


@tenant_page("admin")
def tokens(request: HttpRequest, tenant: str) -> HttpResponse:
    """List, create and revoke the tenant's API tokens.

    A created token is shown once, on the page the POST redirects to
    (post/redirect/get), so reloading the page never creates a second token.
    """
    if request.method == "POST":
        try:
            _, plaintext = services.token_create(
                tenant,
                name=request.POST.get("name", ""),
                role=request.POST.get("role", "admin"),
                created_by=page_principal(request).actor,
            )
            request.session[NEW_TOKEN] = plaintext
            messages.success(request, "Token created. Copy it now: it is not shown again.")
        except DomainError as exc:
            refused = form_error(exc, form="token", fields=TOKEN_FIELDS, typed=request.POST)
            context = _settings_context(request, tenant, form_error=refused)
            return render(request, "tenancy/tokens.html", context, status=exc.status)
        return redirect("tenancy:tokens", tenant=tenant)
    created = request.session.pop(NEW_TOKEN, None)
    return render(request, "tenancy/tokens.html", _settings_context(request, tenant, created=created))


def _settings_context(request: HttpRequest, tenant: str, **extra: object) -> dict[str, object]:
    from botmesh_admin.timefmt import zone_names

    return {
        "tenant": tenant,
        "tokens": selectors.token_list(tenant),
        "zones": zone_names(),
        "time_zone": getattr(request, "tenant_time_zone", ""),
        **extra,
    }


@require_POST
@tenant_page("admin")
def time_zone(request: HttpRequest, tenant: str) -> HttpResponse:
    """Set the zone the tenant's pages show times in (Settings form, or the browser's zone on first use).

    ``initial=1`` (sent by the page's script with the browser's zone) sets it only
    while none is chosen and answers 204 — no page to show. A refused name
    re-renders Settings (422) with the error next to the field.
    """
    name = request.POST.get("time_zone", "")
    initial = request.POST.get("initial") == "1"
    try:
        changed = services.tenant_time_zone_set(tenant, time_zone=name, only_if_unset=initial)
    except DomainError as exc:
        if initial:
            return HttpResponse(status=exc.status)
        refused = form_error(exc, form="time-zone", fields=["time_zone"], typed=request.POST)
        return render(
            request, "tenancy/tokens.html", _settings_context(request, tenant, form_error=refused), status=exc.status
        )
    if initial:
        return HttpResponse(status=204 if not changed else 205)
    messages.success(request, f"Times are now shown in {name}.")
    return redirect("tenancy:tokens", tenant=tenant)


@tenant_page("admin")
def token_revoke(request: HttpRequest, tenant: str, token_id: int) -> HttpResponse:
    """Revoke one token and go back to the list, once confirmed (``botmesh_admin.confirmation``)."""
    back = reverse("tenancy:tokens", kwargs={"tenant": tenant})
    try:
        if not confirmation.confirmed(request):
            token = next((t for t in selectors.token_list(tenant) if t.pk == token_id), None)  # the page's list
            if token is None:
                raise NotFound(f"token {token_id} not found")
            return confirmation.confirm_page(
                request,
                question=f"Revoke the API token {token.name!r} (bm_{token.prefix}_…)?",
                consequences=[
                    f"Every client using it ({token.role} role) gets 401 from now on; a revoked token cannot be"
                    " restored, only replaced by a new one."
                ],
                button="Revoke the token",
                cancel_url=back,
            )
        services.token_revoke(tenant, token_id=token_id)
    except DomainError as exc:
        return render_error(request, exc)
    messages.success(request, "Token revoked.")
    return confirmation.done(request, back)


@tenant_page("admin")
def tenant_erase(request: HttpRequest, tenant: str) -> HttpResponse:
    """Erase the tenant for good after the admin types its id (``services.tenant_erase``)."""
    if request.method == "POST":
        if request.POST.get("confirm", "") != tenant:
            refused = form_error(
                ValidationError("confirm", f"type the tenant id exactly ({tenant}) to erase it"),
                form="erase",
                fields=["confirm"],
                typed=request.POST,
            )
            return render(request, "tenancy/erase.html", {"tenant": tenant, "form_error": refused}, status=422)
        try:
            removed = services.tenant_erase(tenant)
        except DomainError as exc:
            return render_error(request, exc)
        request.principal = None  # type: ignore[attr-defined]  # this request's trace is filed under no tenant
        return render(request, "tenancy/erased.html", {"tenant": tenant, "removed": removed})
    return render(request, "tenancy/erase.html", {"tenant": tenant})
