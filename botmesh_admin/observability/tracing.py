"""OpenTelemetry traces: Django requests, Celery tasks and the message path (ARCHITECTURE §10).

Helpers for the other packages::

    from botmesh_admin.observability.tracing import span, hash_id, inject_context, extract_context

    with span("message.receive", tenant=tenant, chat_id=chat_id, channel="whatsapp"):
        payload["trace"] = inject_context()           # {"traceparent": "00-…", "tenant": …}
        event_publish(tenant, type="inbox.message", payload=payload, idempotency_key=message_id)
    # later, in a worker:
    with span("message.project", parent=record.payload["trace"], conversation_id=conv.id):
        ...

One message is one trace: webhook → journal → projection → CRM upsert → send,
because each step starts its span under the context carried in the journal
payload. Attribute names without a dot get the ``botmesh.`` namespace; ids
(``chat_id``, ``sender_id``, ``phone``…) are stored only as keyed hashes
(``botmesh.chat_id_hash``) and content (``text``, ``caption``, ``note``…) never
(see ``guard``). A span whose name starts with ``message.`` makes its trace a
*message* trace; ``tenant=`` files the trace under that tenant, and
``conversation_id=`` makes it findable from the conversation.

``setup()`` (called from ``ObservabilityConfig.ready()``; idempotent) installs the
tracer provider: export by the standard ``OTEL_*`` variables (OTLP over HTTP
when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set), plus the built-in exporter that
keeps recent traces in the Kv for the dashboard, both behind the guard.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from botmesh_admin.kv.tenant import ID_RE

from .guard import GuardedSpanProcessor, guard_attributes, hash_id

__all__ = ["span", "hash_id", "inject_context", "extract_context", "setup", "force_flush"]

log = logging.getLogger(__name__)
TRACER_NAME = "botmesh_admin"
# Webhooks open their own server span (``server_span``): the generic Django
# instrumentation cost a third of a webhook's CPU, on the busiest path there is.
EXCLUDED_URLS = "//[^/]+/(healthz|readyz|metrics)$,//[^/]+/static/,//[^/]+/favicon.ico$,//[^/]+/webhooks/"
_propagator = TraceContextTextMapPropagator()
HTMX_PARTIAL = "botmesh.htmx_partial"  # a GET an htmx page made for a fragment (a poll, mostly)
BOT_POLL = "botmesh.bot_poll"  # a bot replica's GET of its inbound feed (several a second per replica)
BOT_POLL_ROUTES = ("/api/v1/tenants/{tenant}/bots/{bot}/inbound",)
"""The routes bots poll: sampled as the htmx partials are (``KvTraceProcessor``)."""
PARTIAL_SLOW_MS = 1000
# A proxy until ``setup()`` installs the provider, then that provider's tracer:
# ``trace.get_tracer`` on every span cost a fifth of the span.
_tracer = trace.get_tracer(TRACER_NAME)
_tenant: ContextVar[str | None] = ContextVar("botmesh_trace_tenant", default=None)
_setup_lock = threading.Lock()
_provider: TracerProvider | None = None


# ----------------------------------------------------------------------------- helpers


def _namespaced(attributes: Mapping[str, Any]) -> dict[str, Any]:
    return {(k if "." in k else f"botmesh.{k}"): v for k, v in attributes.items() if v is not None}


@contextmanager
def span(
    name: str,
    /,
    *,
    parent: Mapping[str, str] | None = None,
    span_kind: trace.SpanKind = trace.SpanKind.INTERNAL,
    **attributes: Any,
) -> Iterator[trace.Span]:
    """Run the block inside a new span ``name``; ``parent`` is a carrier from ``inject_context()``.

    ``span_kind`` is the OpenTelemetry span kind (``SERVER`` for a request's own span).
    Keyword arguments become attributes (guarded: ids hashed, content dropped).
    ``tenant`` defaults to the enclosing span's or the carrier's. An exception
    marks the span as an error with the exception's type only (its message
    may hold customer data) and propagates.
    """
    tenant = attributes.get("tenant") or (parent or {}).get("tenant") or _tenant.get()
    if tenant is not None:
        attributes["tenant"] = tenant
    context = extract_context(parent) if parent else None
    links = _links(parent)
    with _tracer.start_as_current_span(
        name,
        context=context,
        kind=span_kind,
        links=links,
        attributes=guard_attributes(_namespaced(attributes)),
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        token = _tenant.set(tenant) if tenant else None
        try:
            yield current
        except BaseException as exc:
            current.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            current.add_event("exception", {"exception.type": type(exc).__qualname__, "exception.escaped": True})
            raise
        finally:
            if token is not None:
                _tenant.reset(token)


_CONVERTER_RE = re.compile(r"<(?:[^<>:]+:)?([^<>:]+)>")


def route_template(route: str) -> str:
    """Return a Django URL route in the one syntax spans use: ``/webhooks/whatsapp/{tenant}``.

    ``webhooks/whatsapp/<str:tenant>`` and ``api/v1/tenants/<tenant>/bots/<path:bot>/metrics``
    become ``/webhooks/whatsapp/{tenant}`` and ``/api/v1/tenants/{tenant}/bots/{bot}/metrics``:
    the ``http.route`` template of the OpenTelemetry HTTP semantic conventions
    (an absolute path with ``{name}`` placeholders, as OpenAPI writes it), with
    no Django converter in it.
    """
    return "/" + _CONVERTER_RE.sub(r"{\1}", route).lstrip("/")


def server_span(view: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a Django view with its own ``SERVER`` span, for URLs in ``EXCLUDED_URLS``.

    The span is named ``"<METHOD> <route>"`` like the Django instrumentation's
    and carries ``http.request.method``, ``http.route`` and
    ``http.response.status_code``; a 5xx answer marks it as an error. The view
    names the tenant (``botmesh.tenant``) once the request is authenticated, so
    unauthenticated requests never file traces under a tenant. It is the local
    root of the trace that the view's work (a journaled message) continues in
    other processes.
    """

    @functools.wraps(view)
    def wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
        match = getattr(request, "resolver_match", None)
        route = route_template(match.route) if match is not None and match.route else request.path
        attributes = {"http.request.method": request.method, "http.route": route, "botmesh.kind": "http"}
        with span(f"{request.method} {route}", span_kind=trace.SpanKind.SERVER, **attributes) as current:
            response = view(request, *args, **kwargs)
            current.set_attribute("http.response.status_code", response.status_code)
            if response.status_code >= 500:
                current.set_status(Status(StatusCode.ERROR))
            return response

    return wrapper


@contextmanager
def untraced() -> Iterator[None]:
    """Run the block under a parent that is not sampled, so the spans it starts are not recorded.

    For housekeeping that serves many traces and belongs to none (a coalesced
    drain queued from a timer): as a root it would file a trace of its own each
    time. Instrumentations that propagate context pass "not sampled" on.
    """
    parent = trace.NonRecordingSpan(
        trace.SpanContext(
            trace_id=random.getrandbits(128) or 1,
            span_id=random.getrandbits(64) or 1,
            is_remote=False,
            trace_flags=trace.TraceFlags(trace.TraceFlags.DEFAULT),
        )
    )
    token = otel_context.attach(trace.set_span_in_context(parent))
    try:
        yield
    finally:
        otel_context.detach(token)


def inject_context() -> dict[str, str]:
    """Return the current trace context as a W3C carrier (``traceparent``, ``tracestate``) plus ``tenant``.

    Store it in a journal payload; ``span(..., parent=carrier)`` continues the trace.
    Empty when no span is active.
    """
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    tenant = _tenant.get()
    if carrier and tenant:
        carrier["tenant"] = tenant
    return carrier


def linked_carrier() -> dict[str, str]:
    """Return a carrier that starts a *new* trace linked to the current span (``link``), plus ``tenant``.

    For one unit of work among many started by one request (each record of a
    ledger push): ``span(..., parent=carrier)`` is then the root of a trace of
    its own, readable alone, with an OpenTelemetry span link back to the
    request's span (shown on the trace page). Empty when no span is active.
    """
    current: dict[str, str] = {}
    _propagator.inject(current)
    if not current.get("traceparent"):
        return {}
    carrier = {"link": current["traceparent"]}
    tenant = _tenant.get()
    if tenant:
        carrier["tenant"] = tenant
    return carrier


def _links(carrier: Mapping[str, str] | None) -> list[trace.Link] | None:
    """Return the span link a ``linked_carrier`` names (``None`` without one)."""
    link = (carrier or {}).get("link")
    if not link:
        return None
    context = trace.get_current_span(_propagator.extract({"traceparent": link})).get_span_context()
    return [trace.Link(context)] if context.is_valid else None


def extract_context(carrier: Mapping[str, str] | None) -> Context:
    """Return the OpenTelemetry context of a carrier from ``inject_context()`` (empty if none)."""
    return _propagator.extract(dict(carrier or {}))


def span_to_dict(span: ReadableSpan) -> dict[str, Any]:
    """Return a finished (guarded) span as the JSON the trace store keeps."""
    ctx = span.context
    start = span.start_time or 0
    end = span.end_time or start
    resource = span.resource.attributes if span.resource else {}
    return {
        "trace_id": format(ctx.trace_id, "032x"),
        "span_id": format(ctx.span_id, "016x"),
        "parent_id": format(span.parent.span_id, "016x") if span.parent else None,
        "name": span.name,
        "kind": span.kind.name.lower(),
        "start_ms": start / 1e6,
        "duration_ms": round((end - start) / 1e6, 3),
        "status": {StatusCode.UNSET: "unset", StatusCode.OK: "ok", StatusCode.ERROR: "error"}[span.status.status_code],
        "status_message": span.status.description or None,
        "attributes": {k: _json(v) for k, v in list((span.attributes or {}).items())[:40]},
        "events": [
            {
                "name": e.name,
                "offset_ms": round((e.timestamp - start) / 1e6, 3),
                "attributes": {k: _json(v) for k, v in (e.attributes or {}).items()},
            }
            for e in list(span.events)[:16]
        ],
        "links": [
            {"trace_id": format(link.context.trace_id, "032x"), "span_id": format(link.context.span_id, "016x")}
            for link in list(span.links)[:8]
        ],
        "scope": span.instrumentation_scope.name if span.instrumentation_scope else None,
        "service": str(resource.get("service.name", "")) or None,
    }


def _json(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


# ----------------------------------------------------------------------------- Kv exporter


class KvTraceProcessor(SpanProcessor):
    """Keep finished spans in the Kv (``services.trace_record``) so every process's traces reach the dashboard.

    Spans are held per trace until the process's local root span ends (or for
    ``hold_s`` seconds), so the whole local part of a trace is filed under the
    tenant that any of its spans names (``botmesh.tenant``); a background
    thread writes them every ``interval_s``. At most ``max_pending`` traces
    wait in memory; beyond that new spans are dropped (and counted).

    The admin's own htmx partials (``botmesh.htmx_partial``: the inbox polls
    its list every 5 s and an open thread every 3 s, the journal, replicas and
    jobs pages poll too) and the bots' polls of their inbound feed
    (``botmesh.bot_poll``: ``BOT_POLL_ROUTES``, several a second per replica)
    are kept one in ``partial_sample`` (by trace id, so every process keeps the
    same ones), and always when they failed or took over ``PARTIAL_SLOW_MS``:
    an open tab or a running bot would otherwise push every other http trace
    out of the kept ones.
    """

    def __init__(
        self,
        record: Callable[[str | None, list[dict[str, Any]]], None] | None = None,
        *,
        hold_s: float = 10.0,
        interval_s: float = 0.5,
        max_pending: int = 2000,
        max_spans: int = 256,
        partial_sample: int = 10,
    ) -> None:
        self._record = record
        self.partial_sample = partial_sample
        self.sampled_out = 0
        self.hold_s = hold_s
        self.interval_s = interval_s
        self.max_pending = max_pending
        self.max_spans = max_spans
        self.dropped = 0
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._pending: dict[str, dict[str, Any]] = {}
        self._wake = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._last_error_log = 0.0
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._pending = {}
        self._wake = threading.Event()
        self._thread = None

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        # The span is kept as it is and turned into JSON by the writer thread: the
        # request (or task) that ended it does not wait for that.
        trace_id = format(span.context.trace_id, "032x")
        local_root = span.parent is None or span.parent.is_remote
        tenant = (span.attributes or {}).get("botmesh.tenant")
        with self._lock:
            if self._stopped:
                return
            segment = self._pending.get(trace_id)
            if segment is None:
                if len(self._pending) >= self.max_pending:
                    self.dropped += 1
                    return
                segment = {"since": time.monotonic(), "spans": [], "tenant": None, "done": False}
                self._pending[trace_id] = segment
            if len(segment["spans"]) < self.max_spans:
                segment["spans"].append(span)
            else:
                self.dropped += 1
            if isinstance(tenant, str) and ID_RE.fullmatch(tenant) and segment["tenant"] is None:
                segment["tenant"] = tenant
            segment["done"] = segment["done"] or local_root
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="botmesh-trace-writer", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            self.flush(force=False)

    def flush(self, force: bool = True) -> None:
        """Write every finished local trace (every held span with ``force``).

        Taking traces out of the pending set and writing them is one step under
        the write lock: a ``force_flush`` that finds nothing pending returns only
        after a write the background thread has started is in the Kv (before,
        it could return while the thread still converted those spans, and a
        reader right after the flush saw no trace).
        """
        with self._write_lock:
            now = time.monotonic()
            with self._lock:
                ready = [
                    (tid, seg)
                    for tid, seg in self._pending.items()
                    if force or seg["done"] or now - seg["since"] > self.hold_s
                ]
                for tid, _ in ready:
                    del self._pending[tid]
            by_tenant: dict[str | None, list[list[dict[str, Any]]]] = {}
            for tid, segment in ready:
                if not self._keep(tid, segment["spans"]):
                    self.sampled_out += 1
                    continue
                spans = [span_to_dict(s) for s in segment["spans"]]
                by_tenant.setdefault(segment["tenant"], []).append(spans)
            for tenant, traces in by_tenant.items():
                self._write(tenant, traces)

    def _keep(self, trace_id: str, spans: list[ReadableSpan]) -> bool:
        """Return False for an htmx partial's trace that sampling leaves out (see the class doc)."""
        partial = [s for s in spans if (s.attributes or {}).get(HTMX_PARTIAL) or (s.attributes or {}).get(BOT_POLL)]
        if not partial or self.partial_sample <= 1 or int(trace_id, 16) % self.partial_sample == 0:
            return True
        slow = any((s.end_time or 0) - (s.start_time or 0) > PARTIAL_SLOW_MS * 1_000_000 for s in partial)
        return slow or any(s.status.status_code == StatusCode.ERROR for s in spans)

    def _write(self, tenant: str | None, traces: list[list[dict[str, Any]]]) -> None:
        try:
            if self._record is not None:
                for spans in traces:
                    self._record(tenant, spans)
            else:
                from .services import trace_record_many

                trace_record_many(tenant, traces)  # one write per batch of traces, not per trace
        except Exception as exc:  # exporting never breaks the traced code
            if time.monotonic() - self._last_error_log > 60:
                self._last_error_log = time.monotonic()
                log.warning("could not keep a trace in the Kv: %s", type(exc).__name__)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.flush(force=True)
        return True

    def shutdown(self) -> None:
        self.flush(force=True)
        self._stopped = True
        self._wake.set()


class _Fanout(SpanProcessor):
    """Several processors as one, behind one guard: the exporters of ``setup`` and, in ``_fanout``,
    those added later (tests add an in-memory exporter there)."""

    def __init__(self) -> None:
        self.processors: list[SpanProcessor] = []

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        for p in list(self.processors):
            p.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        for p in list(self.processors):
            p.on_end(span)

    def shutdown(self) -> None:
        for p in list(self.processors):
            p.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return all(p.force_flush(timeout_millis) for p in list(self.processors))


_fanout = _Fanout()
_kv_processor: KvTraceProcessor | None = None


# ----------------------------------------------------------------------------- setup


def _process_role() -> str:
    argv = " ".join(sys.argv[:4])
    if "celery" in argv:
        return "beat" if " beat" in argv else "worker"
    return "web"


def _otlp_processor() -> SpanProcessor | None:
    choice = (os.environ.get("OTEL_TRACES_EXPORTER") or "").strip().lower()
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if choice == "none" or (not choice and not endpoint):
        return None
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if choice == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return BatchSpanProcessor(ConsoleSpanExporter())
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return BatchSpanProcessor(OTLPSpanExporter())


def setup() -> TracerProvider | None:
    """Install the tracer provider, the exporters and the Django and Celery instrumentation, once.

    Does nothing when ``OTEL_SDK_DISABLED=true``. Return the provider.
    """
    global _provider, _kv_processor
    with _setup_lock:
        if _provider is not None:
            return _provider
        if (os.environ.get("OTEL_SDK_DISABLED") or "").strip().lower() == "true":
            return None
        from django.conf import settings
        from opentelemetry.sdk.resources import Resource

        attributes = {"botmesh.process": _process_role()}
        if not os.environ.get("OTEL_SERVICE_NAME"):
            attributes["service.name"] = "botmesh-admin"
        provider = TracerProvider(resource=Resource.create(attributes))
        # Every exporter behind one guard: the guard copies each span, once is enough.
        exporters = _Fanout()
        otlp = _otlp_processor()
        if otlp is not None:
            exporters.processors.append(otlp)
        if getattr(settings, "BOTMESH_TRACE_STORE", True):
            _kv_processor = KvTraceProcessor()
            exporters.processors.append(_kv_processor)
        exporters.processors.append(_fanout)
        provider.add_span_processor(GuardedSpanProcessor(exporters))
        trace.set_tracer_provider(provider)
        _provider = provider
    _instrument_django(provider)
    _instrument_celery(provider)
    return provider


def _django_response_hook(span: trace.Span, request: Any, response: Any) -> None:
    if not span.is_recording():
        return
    principal = getattr(request, "principal", None)
    if principal is not None:
        span.set_attribute("botmesh.tenant", principal.tenant)
    if request.method == "GET" and request.headers.get("HX-Request") == "true":
        span.set_attribute(HTMX_PARTIAL, True)
    # The instrumentation names the span after Django's route (``GET t/<str:tenant>/metrics/``);
    # every span of ours says ``GET /t/{tenant}/metrics/``, as the webhooks' ``server_span`` does.
    match = getattr(request, "resolver_match", None)
    if match is not None and match.route:
        route = route_template(match.route)
        span.set_attribute("http.route", route)
        span.update_name(f"{request.method} {route}")
        if request.method == "GET" and route in BOT_POLL_ROUTES:
            span.set_attribute(BOT_POLL, True)


class WsgiPathMiddleware:
    """Give the request's ``PATH_INFO`` back its WSGI form before the OpenTelemetry middleware reads it.

    Django replaces ``META["PATH_INFO"]`` with the decoded path; the
    instrumentation rebuilds the URL with ``wsgiref.util.request_uri``, which
    encodes ``PATH_INFO`` as Latin-1, as PEP 3333 says it is — so a path holding
    a character beyond U+00FF (a bot id ``🤖`` in ``/bots/%F0%9F%A4%96/metrics``)
    raised ``UnicodeEncodeError``: a 500 for the request
    (open-telemetry/opentelemetry-python-contrib#3237). Only ``META`` changes
    (the UTF-8 bytes as Latin-1, PEP 3333's "bytes in a str"): Django routes by
    ``request.path_info``, which stays decoded.
    """

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        path = request.META.get("PATH_INFO")
        if isinstance(path, str) and not path.isascii():
            request.META["PATH_INFO"] = path.encode("utf-8", "surrogateescape").decode("latin-1")
        return self.get_response(request)


WSGI_PATH_MIDDLEWARE = f"{__name__}.WsgiPathMiddleware"
JSON_ERROR_MIDDLEWARE = "botmesh_admin.httperrors.JsonErrorMiddleware"
DJANGO_TRACING_MIDDLEWARE = f"{__name__}.DjangoTracingMiddleware"
OWN_SPAN_PREFIXES = ("/webhooks/",)
"""Paths whose views open their own ``server_span``: the generic instrumentation never runs for them."""


class DjangoTracingMiddleware:
    """The OpenTelemetry Django middleware, skipped for ``OWN_SPAN_PREFIXES`` (the webhooks).

    Those URLs are in ``EXCLUDED_URLS``, so the instrumentation records nothing
    for them, but it still rebuilt the absolute URL and matched it against the
    exclusions three times per request (request, view, response): 0.03-0.05 ms
    of CPU per webhook (a POST to a trivial view, A/B in one process: 0.23 ->
    0.18 ms median). Every other path goes through the instrumentation unchanged.
    """

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        from opentelemetry.instrumentation.django.middleware.otel_middleware import _DjangoMiddleware

        self.get_response = get_response
        self._otel = _DjangoMiddleware(get_response)

    @staticmethod
    def _own_span(request: Any) -> bool:
        return str(request.path_info).startswith(OWN_SPAN_PREFIXES)

    def __call__(self, request: Any) -> Any:
        if self._own_span(request):
            return self.get_response(request)
        return self._otel(request)

    def process_view(self, request: Any, view_func: Any, *args: Any, **kwargs: Any) -> Any:
        if self._own_span(request):
            return None
        return self._otel.process_view(request, view_func, *args, **kwargs)

    def process_exception(self, request: Any, exception: Exception) -> Any:
        if self._own_span(request):
            return None
        return self._otel.process_exception(request, exception)


def _instrument_django(provider: TracerProvider) -> None:
    from django.conf import settings
    from opentelemetry.instrumentation.django import DjangoInstrumentor

    instrumentor = DjangoInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(
            tracer_provider=provider, excluded_urls=EXCLUDED_URLS, response_hook=_django_response_hook
        )
    # The instrumentation put its middleware first; this one goes before it, and the JSON
    # error middleware before both: OpenTelemetry's reads the Host (build_absolute_uri), and a
    # bad one raised there would be Django's HTML 400 on /api/ with DEBUG on.
    from opentelemetry.instrumentation.django.middleware.otel_middleware import _DjangoMiddleware

    otel = f"{_DjangoMiddleware.__module__}.{_DjangoMiddleware.__qualname__}"
    middleware = [DJANGO_TRACING_MIDDLEWARE if m == otel else m for m in settings.MIDDLEWARE]
    if WSGI_PATH_MIDDLEWARE not in middleware:
        middleware = [WSGI_PATH_MIDDLEWARE, *middleware]
    if JSON_ERROR_MIDDLEWARE in middleware:
        middleware = [JSON_ERROR_MIDDLEWARE, *(m for m in middleware if m != JSON_ERROR_MIDDLEWARE)]
    settings.MIDDLEWARE = middleware


def _instrument_celery(provider: TracerProvider) -> None:
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    instrumentor = CeleryInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(tracer_provider=provider)


def setup_worker_child(**_: Any) -> None:
    """``worker_process_init``: make sure this prefork child traces (its own writer thread, Celery spans)."""
    provider = setup()
    if provider is not None:
        _instrument_celery(provider)


def force_flush(timeout_ms: int = 5000, **_: Any) -> None:
    """Export every finished span now (on shutdown; also the ``worker_process_shutdown`` hook)."""
    if _provider is not None:
        _provider.force_flush(timeout_ms)


def add_span_processor(processor: SpanProcessor) -> Callable[[], None]:
    """Add ``processor`` (behind the guard) to the running provider; return a function that removes it."""
    _fanout.processors.append(processor)
    return lambda: _fanout.processors.remove(processor)


@contextmanager
def capture(exporter: SpanExporter) -> Iterator[SpanExporter]:
    """Send every span that ends inside the block to ``exporter``, guarded like any export (tests)."""
    setup()
    processor = SimpleSpanProcessor(exporter)
    remove = add_span_processor(processor)
    try:
        yield exporter
    finally:
        remove()
