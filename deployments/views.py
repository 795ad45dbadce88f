"""Admin pages of deployments: the bots, a bot's versions timeline with gate
status, activate / roll back with a confirmation step, and the audit log.

Pages read with the agent role; activation and rollback need admin. The
confirmation is a page of its own (works without JavaScript) whose form
carries the active pointer's revision the admin saw: if someone else switched
the deployment meanwhile, the admin gets a conflict, not a surprise.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from botmesh_admin.clock import now_ms
from botmesh_admin.errors import DomainError, NotFound, ValidationError
from botmesh_admin.formerrors import error_text, form_error
from botmesh_admin.tenancy.decorators import page_principal, tenant_page
from botmesh_admin.validation import ascii_digits

from . import selectors, services
from .domain import MAX_REASON, ActivePointer, BotVersion, validate_bot

PAGE = 50
ACTIONS = ("activate", "rollback")


@tenant_page("agent")
def bots(request: HttpRequest, tenant: str) -> HttpResponse:
    """The tenant's bots with their active version."""
    after = request.GET.get("after") or None
    items = selectors.bot_list(tenant, limit=PAGE, after=after)
    return render(
        request,
        "deployments/bots.html",
        {"tenant": tenant, "bots": items, "next": items[-1].bot if len(items) == PAGE else None},
    )


@tenant_page("agent")
def bot(request: HttpRequest, tenant: str, bot: str) -> HttpResponse:
    """The versions timeline of one bot (newest first) with gates, actions and recent audit."""
    return _bot_page(request, tenant, bot)


def _bot_page(request: HttpRequest, tenant: str, bot: str, *, status: int = 200, **extra: object) -> HttpResponse:
    """Render the bot page (``extra``: a refused decision's ``form_error`` and ``refused_gate``) with ``status``."""
    validate_bot(bot)
    versions = selectors.version_list(tenant, bot, limit=PAGE, after=request.GET.get("after") or None)
    active = selectors.deployment_active(tenant, bot)
    if not versions and active is None and not request.GET.get("after"):
        raise NotFound(f"bot {bot!r} has no versions")
    now = now_ms()
    rows = []
    for v in versions:
        is_active = active is not None and active.version == v.version
        action = None
        if not is_active and v.gates_passed:
            action = "rollback" if active is not None and v.seq < active.seq else "activate"
        rows.append({"v": v, "summary": v.gate_summary(now), "active": is_active, "action": action})
    return render(
        request,
        "deployments/bot.html",
        {
            "tenant": tenant,
            "bot": bot,
            "rows": rows,
            "active": active,
            "next": str(versions[-1].seq) if len(versions) == PAGE else None,
            "audit": selectors.deployment_audit_list(tenant, bot, limit=10),
            "can_write": page_principal(request).can("admin"),
            "max_reason": MAX_REASON,
            **extra,
        },
        status=status,
    )


@require_POST
@tenant_page("admin")
def gate_decide(request: HttpRequest, tenant: str, bot: str, version: str, gate: str) -> HttpResponse:
    """Approve or reject a gate that waits for a person, with the reason (``services.gate_decide``, as the API).

    Admins only: an agent sees no buttons and its POST is refused (403 page).
    """
    decision = request.POST.get("decision", "")
    try:
        services.gate_decide(
            tenant,
            bot,
            version,
            gate,
            decision=decision,
            reason=request.POST.get("reason", ""),
            actor=page_principal(request).actor,
        )
    except DomainError as exc:
        if exc.status == 404:
            raise
        # The page again, 422 (an empty reason: under that gate's input, the typed text kept) or 409 (someone
        # decided it meanwhile: the page shows how), never a redirect that answers 200.
        refused = form_error(exc, form="gate", fields=["reason"], typed=request.POST)
        return _bot_page(request, tenant, bot, status=exc.status, form_error=refused, refused_gate=f"{version}/{gate}")
    verb = "approved" if decision == "approve" else "rejected"
    messages.success(request, f"Gate {gate} of {version} {verb}.")
    return redirect("deployments:bot", tenant=tenant, bot=bot)


def _revision(request: HttpRequest) -> int | None:
    """Return the active pointer's revision the confirm form showed (``expected_version``, the API's name;
    ``expected_revision`` from a page opened before the rename), ``None`` if it sent none."""
    name = "expected_version" if "expected_version" in request.POST else "expected_revision"
    raw = request.POST.get(name, "")
    if not raw:
        return None
    if not ascii_digits(raw):
        raise ValidationError(name, "not a revision number")
    return int(raw)


@tenant_page("agent")
def confirm(request: HttpRequest, tenant: str, bot: str, action: str, version: str) -> HttpResponse:
    """GET: ask to confirm activating / rolling back to ``version``. POST (admin): do it."""
    if action not in ACTIONS:
        raise NotFound(f"no action {action!r}")
    target = selectors.version_get(tenant, bot, version)
    active = selectors.deployment_active(tenant, bot)
    if request.method == "POST":
        principal = page_principal(request)
        principal.require("admin")
        try:
            if action == "activate":
                services.deployment_activate(
                    tenant,
                    bot,
                    version,
                    actor=principal.actor,
                    expected_revision=_revision(request),
                )
                messages.success(request, f"{bot} {version} is now active.")
            else:
                services.deployment_rollback(
                    tenant,
                    bot,
                    to=version,
                    actor=principal.actor,
                    expected_revision=_revision(request),
                )
                messages.success(request, f"Rolled {bot} back to {version}.")
        except DomainError as exc:
            if exc.status == 404:
                raise
            # The question again, as it stands now, with why it was refused (409: someone changed the
            # active deployment meanwhile), never a redirect that answers 200.
            active = selectors.deployment_active(tenant, bot)
            return _confirm_page(request, tenant, bot, action, target, active, refused=exc)
        return redirect("deployments:bot", tenant=tenant, bot=bot)
    return _confirm_page(request, tenant, bot, action, target, active)


def _confirm_page(
    request: HttpRequest,
    tenant: str,
    bot: str,
    action: str,
    target: BotVersion,
    active: ActivePointer | None,
    refused: DomainError | None = None,
) -> HttpResponse:
    """Render the activate / roll back question (``refused``: the error of the last try, its status)."""
    return render(
        request,
        "deployments/confirm.html",
        {
            "tenant": tenant,
            "bot": bot,
            "action": action,
            "target": target,
            "active": active,
            "revision": active.revision if active else 0,
            "can_write": page_principal(request).can("admin"),
            "refused": refused,
            "refused_text": error_text(refused) if refused is not None else "",
        },
        status=refused.status if refused is not None else 200,
    )


@tenant_page("agent")
def audit(request: HttpRequest, tenant: str, bot: str) -> HttpResponse:
    """Every publish, gate run, activation, rollback and prune of the bot, newest first."""
    events = selectors.deployment_audit_list(tenant, bot, limit=PAGE, after=request.GET.get("after") or None)
    return render(
        request,
        "deployments/audit.html",
        {
            "tenant": tenant,
            "bot": bot,
            "events": events,
            "next": events[-1].id if len(events) == PAGE else None,
        },
    )
