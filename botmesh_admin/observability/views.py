"""``/metrics`` for Prometheus, and the tenant's metrics and traces pages."""

from __future__ import annotations

import hmac
import logging

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from botmesh_admin.clock import now_ms
from botmesh_admin.errors import BadRequest, DomainError, NotFound, ValidationError, bounded
from botmesh_admin.tenancy.decorators import list_query_checked, render_error, tenant_page

from . import metrics, prometheus, selectors

log = logging.getLogger(__name__)

WINDOWS = {"15m": 15 * 60_000, "1h": 3_600_000, "6h": 6 * 3_600_000, "24h": 24 * 3_600_000}
PAGE_SIZE = 50


ADMIN_PREFIX = "botmesh_admin_"
ADMIN_LABELS = {"service": "botmesh-admin"}  # the service.name its traces carry


@require_GET
def prometheus_metrics(request: HttpRequest) -> HttpResponse:
    """Serve one series set per live pushed bot replica, then the admin's own, text format 0.0.4.

    Bots' series are ``botmesh_<family>{tenant, bot, replica}`` for each replica
    that pushed within ``BOTMESH_METRICS_REPLICA_TTL_S``. The admin's own
    counters are the same families named ``botmesh_admin_<family>`` with
    ``service="botmesh-admin"``, so ``sum(botmesh_messages_in_total)`` adds up
    the bots only; their ``uptime_seconds`` is the shared counters' (the same
    whichever gunicorn worker answers). When ``settings.BOTMESH_METRICS_TOKEN``
    is set, the scraper must send it as ``Authorization: Bearer <token>`` (else 401).
    """
    token = getattr(settings, "BOTMESH_METRICS_TOKEN", None)
    if token:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), str(token).encode()):
            return HttpResponse("unauthorized\n", status=401, content_type="text/plain; charset=utf-8")
    try:
        live_ms = settings.BOTMESH_METRICS_REPLICA_TTL_S * 1000
        sets: list[tuple[prometheus.SnapshotLike, dict[str, str] | None]] = [
            (sample.snapshot, {"tenant": tenant, "bot": sample.bot, "replica": sample.replica})
            for tenant, sample in selectors.bot_metrics_all_latest(now_ms=now_ms(), live_ms=live_ms)
        ]
        body = prometheus.to_prometheus_many(sets) + prometheus.to_prometheus(
            metrics.process_snapshot(), prefix=ADMIN_PREFIX, labels=ADMIN_LABELS
        )
    except Exception as exc:  # the scraper gets a clear failure, not a half page
        log.warning("metrics unavailable: %s", type(exc).__name__)
        return HttpResponse("metrics store unavailable\n", status=503, content_type="text/plain; charset=utf-8")
    return HttpResponse(body, content_type=prometheus.CONTENT_TYPE)


@tenant_page("agent")
def metrics_page(request: HttpRequest, tenant: str) -> HttpResponse:
    """Per bot and replica: the latest counters (a table) and counters and rates over time (charts)."""
    latest = selectors.bot_metrics_latest(tenant)
    bots = sorted({s.bot for s in latest})
    bot = request.GET.get("bot") or (bots[0] if bots else None)
    window = request.GET.get("window") or "1h"
    if window not in WINDOWS:
        raise BadRequest(f"window: must be one of {', '.join(WINDOWS)} (remove it from the address)", field="window")
    series = None
    if bot is not None:
        if bot not in bots:
            raise BadRequest(f"bot: no live replica of bot {bounded(bot, 60)!r}", field="bot")
        until = now_ms()
        series = selectors.bot_metrics_series(tenant, bot=bot, since_ms=until - WINDOWS[window])
        # One x range for every chart of the page (the window chosen, up to now), read in the tenant's zone.
        series["range"] = {
            "from_ms": until - WINDOWS[window],
            "to_ms": until,
            "zone": timezone.get_current_timezone_name(),
        }
    return render(
        request,
        "observability/metrics.html",
        {
            "tenant": tenant,
            "bots": bots,
            "bot": bot,
            "window": window,
            "windows": list(WINDOWS),
            "replicas": [s for s in latest if s.bot == bot],
            "series": series,
        },
    )


def _trace_tenant(request: HttpRequest, tenant: str) -> str | None:
    """Return whose traces the page shows: the tenant's, or (``?scope=system``) those of no tenant.

    Traces of no tenant hold other tenants' failed requests (unknown tenants, bad
    tokens), so only a superuser sees them; to anybody else they do not exist.
    """
    if request.GET.get("scope", "tenant") != "system":
        return tenant
    if not request.user.is_superuser:
        raise NotFound("no such trace list")
    return None


@tenant_page("agent")
def traces_page(request: HttpRequest, tenant: str) -> HttpResponse:
    """Recent traces, newest first; filters ``kind``, ``conversation``; superusers may see traces of no tenant."""
    owner = _trace_tenant(request, tenant)
    scope = "tenant" if owner is not None else "system"
    kind = request.GET.get("kind") or None
    conversation = (request.GET.get("conversation") or "").strip() or None
    after = request.GET.get("after") or None
    try:
        with list_query_checked():  # a bad kind or cursor in the address: 400
            items, next_cursor = selectors.trace_list(
                owner,
                kind=kind,
                conversation=conversation,
                limit=PAGE_SIZE,
                after=after,
            )
    except DomainError as exc:
        return render_error(request, exc)
    context = {
        "tenant": tenant,
        "items": items,
        "next": next_cursor,
        "kind": kind or "",
        "kinds": selectors.TRACE_KINDS,
        "conversation": conversation or "",
        "scope": scope,
        "can_system": request.user.is_superuser,
    }
    template = "observability/_trace_list.html" if request.headers.get("HX-Request") else "observability/traces.html"
    return render(request, template, context)


@tenant_page("agent")
def message_trace(request: HttpRequest, tenant: str) -> HttpResponse:
    """Redirect to the trace of the inbox message ``?id=`` (the thread's "trace" link); a 404 page if none is kept.

    Without ``id`` the address is incomplete: a 400 page naming it. An id no message can have is a 404 too.
    """
    message_id = request.GET.get("id", "")
    if not message_id.strip():
        raise BadRequest("id: the address needs the message's id (…/traces/message/?id=<message id>)", field="id")
    try:
        trace_id = selectors.trace_of_message(tenant, message_id)
    except ValidationError:
        raise NotFound("no trace of this message is kept (traces are kept for 24 hours)") from None
    return redirect(reverse("observability:trace", kwargs={"tenant": tenant, "trace_id": trace_id}))


@tenant_page("agent")
def trace_page(request: HttpRequest, tenant: str, trace_id: str) -> HttpResponse:
    """One trace as a span tree with each span's start offset and duration."""
    owner = _trace_tenant(request, tenant)
    scope = "tenant" if owner is not None else "system"
    trace = selectors.trace_get(owner, trace_id)
    summary = trace["summary"]
    total = max(summary.duration_ms, 0.001)
    rows = []
    for depth, span in trace["tree"]:
        offset = span["start_ms"] - summary.start_ms
        rows.append(
            {
                "depth": depth,
                "indent": depth * 16,
                "span": span,
                "offset_ms": round(offset, 3),
                "left": round(100 * offset / total, 2),
                "width": max(0.5, round(100 * span["duration_ms"] / total, 2)),
                "attributes": sorted(span["attributes"].items()),
                "links": [link["trace_id"] for link in span.get("links", ())],
            }
        )
    return render(
        request,
        "observability/trace.html",
        {
            "tenant": tenant,
            "trace": trace,
            "summary": summary,
            "rows": rows,
            "scope": scope,
        },
    )
