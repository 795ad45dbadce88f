"""``/t/<tenant>/channels/`` — the admin page of the tenant's channels (mounted by the root urls).

Secrets are write-only here: a form never shows a stored secret back, only
"set ✓"; leaving a secret field empty keeps the stored value.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path, reverse

from botmesh_admin import confirmation
from botmesh_admin.errors import DomainError, ValidationError
from botmesh_admin.formerrors import FormError, form_error
from botmesh_admin.tenancy.decorators import render_error, tenant_page

from . import credentials, selectors, services
from .domain import SECRET_LABELS, SECRETS_OF_KIND, Channel

FORM_FIELDS = ("name", "api_base_url", "phone_number_id", "display_phone_number", "bot_username")


def _webhook_url(request: HttpRequest, channel: Channel) -> str:
    if channel.kind == "whatsapp":
        url = reverse("webhooks:whatsapp", kwargs={"tenant": channel.tenant})
    else:
        url = reverse("webhooks:telegram", kwargs={"tenant": channel.tenant, "name": channel.name})
    return request.build_absolute_uri(url)


def _rows(request: HttpRequest, tenant: str) -> list[dict[str, Any]]:
    return [
        {
            "channel": c,
            "webhook_url": _webhook_url(request, c),
            "secrets": [(SECRET_LABELS[s], is_set) for s, is_set in c.secrets_set.items()],
        }
        for c in selectors.channel_config_list(tenant)
    ]


@tenant_page("admin")
def channel_list(request: HttpRequest, tenant: str) -> HttpResponse:
    """List the channels; create or update one (POST)."""
    forms: dict[str, dict[str, Any]] = {"whatsapp": {}, "telegram": {}}
    error: FormError | None = None
    status = 200
    edit = request.GET.get("edit")
    if edit:
        try:
            current = selectors.channel_config_get(tenant, name=edit)
            forms[current.kind] = {
                "name": current.name,
                "api_base_url": current.api_base_url or "",
                "phone_number_id": current.phone_number_id or "",
                "display_phone_number": current.display_phone_number or "",
                "bot_username": current.bot_username or "",
                "secrets": current.secrets_set,
                "editing": True,
            }
        except DomainError as exc:
            return render_error(request, exc)
    if request.method == "POST":
        kind = request.POST.get("kind", "")
        fields = {f: request.POST.get(f, "") for f in FORM_FIELDS if f in request.POST}
        secrets = {s: request.POST.get(s, "") for s in SECRETS_OF_KIND.get(kind, ()) if request.POST.get(s)}
        try:
            channel = services.channel_config_set(
                tenant, kind=kind, clear=tuple(request.POST.getlist("clear")), **fields, **secrets
            )
        except ValidationError as exc:
            # Under the field at fault of that kind's form; secrets are never typed back.
            names = [*FORM_FIELDS, *SECRETS_OF_KIND.get(kind, ()), "clear"]
            error, status = form_error(exc, form=kind, fields={f"channel.{n}": n for n in names}), 422
            if kind in forms:
                forms[kind] = {**fields, "editing": bool(edit)}
        else:
            messages.success(request, f"Channel {channel.name!r} saved.")
            return redirect("channels:list", tenant=tenant)
    return render(
        request,
        "channels/list.html",
        {
            "tenant": tenant,
            "rows": _rows(request, tenant),
            "forms": forms,
            "form_error": error,
            "suggestion": credentials.new_token(),
            "labels": SECRET_LABELS,
        },
        status=status,
    )


@tenant_page("admin")
def channel_delete(request: HttpRequest, tenant: str, name: str) -> HttpResponse:
    """Delete one channel and go back to the list, once confirmed (``botmesh_admin.confirmation``)."""
    back = reverse("channels:list", kwargs={"tenant": tenant})
    try:
        channel = selectors.channel_config_get(tenant, name=name)
        if not confirmation.confirmed(request):
            return confirmation.confirm_page(
                request,
                question=f"Delete the channel {name!r}?",
                consequences=[DELETE_CONSEQUENCE[channel.kind]],
                button=f"Delete {name}",
                cancel_url=back,
            )
        services.channel_config_delete(tenant, name=name)
    except DomainError as exc:
        return render_error(request, exc)
    messages.success(request, f"Channel {name!r} deleted.")
    return confirmation.done(request, back)


DELETE_CONSEQUENCE = {
    "whatsapp": "Its credentials are removed: webhooks for this number are refused and replies, resends and "
    "campaigns through it stop until it is added again.",
    "telegram": "Its credentials are removed: this bot's webhook is refused and replies, resends and campaigns "
    "through it stop until it is added again.",
}


app_name = "channels"
urlpatterns = [
    path("", channel_list, name="list"),
    path("<str:name>/delete", channel_delete, name="delete"),
]
