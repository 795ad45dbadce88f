"""The one NinjaAPI: auth, the error shape, cursor pagination, and the package routers.

Every package mounts one ``Router`` under ``/api/v1/tenants/{tenant}/…``. Auth
resolves the caller to a ``Principal`` bound to the path's tenant (per-tenant
API token as ``Authorization: Bearer bm_…``, or the UI session with CSRF); a
token of another tenant gets 404. Errors always have the shape
``{"error": code, "message": ..., "field": ...}`` (ARCHITECTURE §11).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import UnionType
from typing import Any, Generic, TypeVar, Union, get_args, get_origin

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, UnreadablePostError
from django.http.multipartparser import MultiPartParserError
from ninja import Field, NinjaAPI, Query, Schema
from ninja.errors import AuthenticationError, HttpError
from ninja.errors import ValidationError as NinjaValidationError
from ninja.parser import Parser
from ninja.security import APIKeyCookie, HttpBearer
from pydantic import ConfigDict, model_validator

from botmesh_admin.errors import (
    DomainError,
    PermissionDenied,
    ValidationError,
    bounded,
    retry_after_s,
    store_unavailable,
)
from botmesh_admin.httperrors import GUNICORN_REQUEST_LINE_BYTES, too_large_body, unreadable_request
from botmesh_admin.jsonbody import json_load, json_type
from botmesh_admin.pagination import MAX_PAGE, NOT_A_CURSOR
from botmesh_admin.tenancy.principal import Principal
from botmesh_admin.tenancy.selectors import principal_for_token, principal_for_user

T = TypeVar("T")
log = logging.getLogger("botmesh.api")


def _path_tenant(request: HttpRequest) -> str:
    match = request.resolver_match
    tenant = match.kwargs.get("tenant") if match else None
    if not tenant:
        raise Http404("no tenant in path")
    return str(tenant)


ROLES = ("admin", "agent", "bot", "member")
"""What an operation may need: ``admin``; ``agent`` (agents and admins); ``bot`` (a bot's token, or an
admin: never an agent, who would forge customer messages); ``member`` (anyone of the tenant, bots too)."""

DEFAULT_ROLE = "admin"
"""The role of an operation that declares none (the safe default; the sweep test fails on it)."""

F = TypeVar("F", bound=Callable[..., Any])


def requires(role: str) -> Callable[[F], F]:
    """Declare the role an operation needs: ``@requires("agent")`` under ``@router.get(...)``.

    The API checks it once, in its auth (``TenantTokenAuth`` / ``TenantSessionAuth``),
    before the input is validated (403 ``permission_denied``), and documents it
    (``x-botmesh-role``, and the 403 answer). ``tests/test_api_sweep.py`` reads it.
    Raise ``ValueError`` for a role not in ``ROLES``.
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")

    def declare(view: F) -> F:
        view.botmesh_role = role  # type: ignore[attr-defined]
        return view

    return declare


def declared_role(view: Callable[..., Any]) -> str | None:
    """Return the role ``view`` declared with ``requires``, or ``None``."""
    return getattr(view, "botmesh_role", None)


def allows(p: Principal, role: str) -> bool:
    """Return True if the principal ``p`` may call an operation that needs ``role``."""
    return role == "member" or p.can(role)


def _check_role(p: Principal, role: str) -> None:
    if allows(p, role):
        return
    if p.role == "bot":
        raise PermissionDenied(
            "a bot token may only push its ledger and metrics, read handoffs and its inbound feed, and answer"
            " through …/bots/{bot}/replies"
        )
    raise PermissionDenied(f"this action needs the {role} role in tenant {p.tenant!r}")


class TenantTokenAuth(HttpBearer):
    """``Authorization: Bearer bm_<prefix>_<secret>`` of the path's tenant, checked against the operation's role.

    One instance per operation role (``mount_routers``), so no endpoint can
    forget the check: a token of the wrong role is 403 here, before the input
    is read.
    """

    def __init__(self, role: str = DEFAULT_ROLE) -> None:
        super().__init__()
        self.role = role

    def authenticate(self, request: HttpRequest, token: str) -> Principal | None:
        tenant = _path_tenant(request)
        principal = principal_for_token(token, tenant)
        if principal is not None:
            _check_role(principal, self.role)
            request.principal = principal  # type: ignore[attr-defined]
        return principal


class TenantSessionAuth(APIKeyCookie):
    """The admin UI's session (CSRF checked on unsafe methods), as a member of the path's tenant with the role."""

    param_name = settings.SESSION_COOKIE_NAME

    def __init__(self, role: str = DEFAULT_ROLE) -> None:
        super().__init__()
        self.role = role

    def _get_key(self, request: HttpRequest) -> str | None:
        # No session cookie, or a token was presented (and refused): there is no session to
        # check CSRF for, and the caller must hear "a valid API token is required", not "CSRF".
        if self.param_name not in request.COOKIES or "authorization" in request.headers:
            return None
        try:
            return super()._get_key(request)
        except HttpError:
            raise PermissionDenied(
                "CSRF check failed: a session request must send the X-CSRFToken header (or use an API token)"
            ) from None

    def authenticate(self, request: HttpRequest, key: str | None) -> Principal | None:
        if key is None or not request.user.is_authenticated:
            return None
        principal = principal_for_user(request.user, _path_tenant(request))
        if principal is not None:
            _check_role(principal, self.role)
        request.principal = principal  # type: ignore[attr-defined]
        return principal


class JsonBodyParser(Parser):
    """Parse JSON request bodies with ``json_load``: nesting capped, NaN refused, never a 500."""

    def parse_body(self, request: HttpRequest) -> Any:
        return json_load(request.body, field="body")


api = NinjaAPI(
    title="botmesh-admin",
    parser=JsonBodyParser(),
    version="1",
    urls_namespace="api",
    docs_url="/docs",
    auth=[TenantTokenAuth(), TenantSessionAuth()],
)


def error_response(request: HttpRequest, status: int, body: dict[str, Any]) -> HttpResponse:
    """Render the one error shape."""
    return api.create_response(request, body, status=status)


PATH_LOOKUP_IDS = frozenset(
    {"plugin_id", "conversation_id", "contact_id", "segment_id", "campaign_id", "event_id", "trace_id", "job_id"}
)
"""Path parameters that look an object up by its id: a malformed one is 404 ``not_found``."""


def _path_id_not_found(request: HttpRequest, exc: DomainError) -> DomainError:
    """Return a ``ValidationError`` of an id the path carries (``plugins/{plugin_id}``) as the 404 of that id.

    ``GET …/plugins/nope``: no object has that id, so it is not found (what most
    APIs answer), rather than a 422 of input the client typed into a body. Only
    the ids of ``PATH_LOOKUP_IDS``: a name the client makes up (a tenant, a bot,
    a chat id) keeps its 422, whose message says the format it must have.
    """
    match = request.resolver_match
    field = exc.field if isinstance(exc, ValidationError) else None
    if field in PATH_LOOKUP_IDS and match is not None and field in match.kwargs:
        from botmesh_admin.tenancy.decorators import address_not_found

        return address_not_found(field, match.kwargs[field])
    return exc


@api.exception_handler(DomainError)
def _domain_error(request: HttpRequest, exc: DomainError) -> HttpResponse:
    exc = _path_id_not_found(request, exc)
    response = error_response(request, exc.status, exc.to_json())
    retry = retry_after_s(exc)
    if retry is not None:
        response["Retry-After"] = str(max(1, round(retry)))
    return response


_unexpected = api._lookup_exception_handler(Exception())  # ninja's own: Django's 500 (a traceback in DEBUG)


@api.exception_handler(Exception)
def _store_error(request: HttpRequest, exc: Exception) -> HttpResponse:
    """A driver's "cannot reach the server" (the Django database, Redis, the broker): JSON 503 + Retry-After.

    Any other exception that no handler above knows goes on to ninja's default.
    """
    unavailable = store_unavailable(exc)
    if unavailable is None:
        if _unexpected is None:
            raise exc
        return _unexpected(request, exc)
    log.warning("api %s %s: %s (%s: %s)", request.method, request.path, unavailable.message,
                type(exc).__name__, exc)  # fmt: skip
    return _domain_error(request, unavailable)


_LOCATIONS = ("query", "path", "header", "cookie", "form", "file")


def input_path(loc: Any) -> list[str]:
    """Return the field path of a ninja/pydantic error ``loc``, starting at the input's own fields.

    ninja says ``["body", <parameter>, "identities", 0]`` for a body schema (the
    parameter's name is not in the JSON: ``["body", "body", …]`` for ``body: ContactIn``)
    and ``["query", "limit"]`` for a query parameter: the answer is
    ``["identities", "0"]`` and ``["limit"]``; the whole body is ``["body"]``.
    Each part is cut to ``MAX_ECHO_CHARS`` (a key is the client's text).
    """
    parts = [str(p) for p in loc or ()]
    if parts and parts[0] == "body":
        parts = parts[2:] or ["body"]
    elif parts and parts[0] in _LOCATIONS:
        parts = parts[1:]
    return [bounded(p) for p in parts]


def _input_message(error: dict[str, Any], loc: list[str]) -> str:
    """Return the words of one pydantic input error: a cursor of another shape says so, not the pattern."""
    if error.get("type") == "string_pattern_mismatch" and loc and loc[-1] == "after":
        return NOT_A_CURSOR  # as ``cursor_check`` says
    return str(error.get("msg", "invalid"))


@api.exception_handler(NinjaValidationError)
def _input_error(request: HttpRequest, exc: NinjaValidationError) -> HttpResponse:
    """Render ninja's input errors in the one shape; ``field`` and each ``loc`` come from ``input_path``."""
    errors = [{"loc": (loc := input_path(e.get("loc"))), "msg": _input_message(e, loc)} for e in exc.errors]
    first = errors[0] if errors else {"loc": [], "msg": "invalid input"}
    field = bounded(".".join(first["loc"])) or None
    message = f"{field}: {first['msg']}" if field else str(first["msg"])
    body = {"error": "validation_error", "message": message, "field": field, "errors": errors}
    return error_response(request, 422, body)


def too_large(request: HttpRequest) -> HttpResponse:
    """The JSON 413 of a request body over ``DATA_UPLOAD_MAX_MEMORY_SIZE``."""
    return JsonResponse(too_large_body(), status=413)


@api.exception_handler(RequestDataTooBig)
def _too_large(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    return too_large(request)


@api.exception_handler(SuspiciousOperation)
@api.exception_handler(MultiPartParserError)
@api.exception_handler(UnreadablePostError)
def _unreadable(request: HttpRequest, exc: Exception) -> HttpResponse:
    """A request Django cannot read (no multipart boundary, over 100 files, a bad ``Host``): JSON 400."""
    status, body = unreadable_request(exc) or (400, {"error": "bad_request", "message": str(exc), "field": None})
    log.warning("api %s %s refused: %s", request.method, request.path, body["message"])
    return error_response(request, status, body)


@api.exception_handler(AuthenticationError)
def _auth_error(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    return error_response(
        request, 401, {"error": "unauthenticated", "message": "a valid API token or session is required", "field": None}
    )


@api.exception_handler(Http404)
def _not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    return error_response(request, 404, {"error": "not_found", "message": str(exc) or "not found", "field": None})


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    if isinstance(exc.__cause__, DomainError):  # ninja wraps what the body parser raised
        return _domain_error(request, exc.__cause__)
    return error_response(request, exc.status_code, {"error": "http_error", "message": str(exc), "field": None})


class ErrorOut(Schema):
    """The error shape of every non-2xx answer."""

    error: str
    message: str
    field: str | None = None


class Page(Schema, Generic[T]):
    """One page of a cursor-paginated list: pass ``next`` back as ``after`` for the following page."""

    items: list[T]
    next: str | None = None


REQUEST_LINE_RESERVE = 1024
"""Bytes of gunicorn's request line kept for the method, the path and the other query parameters."""

CURSOR_MAX_CHARS = (GUNICORN_REQUEST_LINE_BYTES - REQUEST_LINE_RESERVE) // 12
"""Characters of an ``after`` cursor whatever they are: a code point is up to 4 UTF-8 bytes, each
percent-encoded as 3, so 12 bytes of request line (255 characters: 3,060 bytes). A list whose cursors
are URL-safe ASCII declares that pattern and may allow more (one byte a character)."""


class BodyIn(Schema):
    """A request body: a field it does not declare is a 422 naming that field (``body.bogus_field``: a typo
    or a field of another action, such as ``scheduled_at`` on a create, is never ignored and answered 2xx
    with nothing of it done). Every write schema of the apps derives from it (inbox has its own, the same)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _one_version_name(cls, data: Any) -> Any:
        """A body with both ``expected_version`` and ``expected_revision`` (0.1's name) uses the first (README)."""
        if isinstance(data, dict) and "expected_revision" in data and "expected_version" in data:
            if "expected_version" in cls.model_fields:
                return {k: v for k, v in data.items() if k != "expected_revision"}
        return data


class CursorParams(Schema):
    """``limit`` (1..200, default 50) and ``after`` (exclusive cursor from the previous ``next``)."""

    limit: int = Field(50, ge=1, le=MAX_PAGE)
    after: str | None = Field(
        None,
        max_length=CURSOR_MAX_CHARS,
        description="the previous page's next (opaque); bounded so the request line fits gunicorn's 4,094 bytes",
    )


def one_of(values: tuple[str, ...], default: Any = ..., **kwargs: Any) -> Any:
    """Return a ``Field`` whose schema declares ``enum: values`` (OpenAPI), taken from the domain's constant.

    The domain still checks the value (422 naming the field, its own message);
    the declaration tells clients and schemathesis what is valid.
    """
    return Field(default, json_schema_extra={"enum": list(values)}, **kwargs)


EXPECTED_VERSION_DOC = (
    "compare-and-set: the version (revision) you saw; 409 with current_version if it changed. "
    "expected_revision (its name in 0.1) is still accepted for one release"
)


def expected_version_field(default: Any = None, description: str = EXPECTED_VERSION_DOC) -> Any:
    """Return the ``expected_version`` field of a compare-and-set body, also read as ``expected_revision``.

    One wire name everywhere (issue 18): hub and deployments said
    ``expected_revision``; clients that still send it keep working for one release.
    """
    from pydantic import AliasChoices

    return Field(default, validation_alias=AliasChoices("expected_version", "expected_revision"),
                 description=description)  # fmt: skip


def principal(request: HttpRequest) -> Principal:
    """Return the request's principal (set by the auth classes)."""
    return request.auth  # type: ignore[attr-defined,no-any-return]


def mount_routers() -> None:
    """Mount each package's router. Each ``<app>.api`` module exposes ``router`` and ``PREFIX``."""
    import importlib

    for module_name in (
        "botmesh_admin.events.api",
        "botmesh_admin.channels.api",
        "botmesh_admin.observability.api",
        "botmesh_admin.dashboard.api",
        "botmesh_admin.tenancy.api",
        "inbox.api",
        "crm.api",
        "campaigns.api",
        "hub.api",
        "deployments.api",
    ):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue
            raise
        router = getattr(module, "router", None)
        if router is not None:
            prefix = getattr(module, "PREFIX", "/tenants/{tenant}/")
            _bind_prefix_path_params(router, prefix)
            _require_object_bodies(router)
            _bind_roles_and_errors(router)
            api.add_router(prefix, router)


UNSAFE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


def error_statuses(methods: list[str], role: str) -> set[int]:
    """Return the error statuses any operation of ``methods`` needing ``role`` can answer (besides its own).

    401 without a valid token or session; 403 for a role below ``role`` (and a
    session's failed CSRF check on an unsafe method); 404 for another tenant's
    token, a tenant that does not exist or an id not in the tenant; 422 for bad
    input; 503 while a store is unreachable; with a body, 400 (unreadable) and
    413 (over ``DATA_UPLOAD_MAX_MEMORY_SIZE``).
    """
    statuses = {401, 404, 422, 503}
    if role != "member" or UNSAFE_METHODS & set(methods):
        statuses.add(403)
    if {"POST", "PUT", "PATCH"} & set(methods):
        statuses |= {400, 413}
    return statuses


def _bind_roles_and_errors(router: Any) -> None:
    """Give each operation the auth of its declared role, ``x-botmesh-role`` and the shared error answers."""
    for path_view in router.path_operations.values():
        for operation in path_view.operations:
            role = declared_role(operation.view_func) or DEFAULT_ROLE
            operation.auth_param = [TenantTokenAuth(role), TenantSessionAuth(role)]
            operation._set_auth(operation.auth_param)
            operation.openapi_extra = {**(operation.openapi_extra or {}), "x-botmesh-role": role}
            for status in sorted(error_statuses(operation.methods, role) - set(operation.response_models)):
                operation.response_models[status] = operation._create_response_model(ErrorOut)
    for _sub_prefix, sub_router, *_ in getattr(router, "_routers", []):
        _bind_roles_and_errors(sub_router)


def _require_object_bodies(router: Any) -> None:
    """Make each operation whose body is a schema (a JSON object) refuse any other JSON: 422 on ``body``.

    ninja's ``Schema`` reads attributes of whatever it is given, so ``[1, 2]``
    sent for ``body: ContactIn`` said "identities: Field required".
    """
    for path_view in router.path_operations.values():
        for operation in path_view.operations:
            operation.models = [_object_body_model(model) for model in operation.models]
    for _sub_prefix, sub_router, *_ in getattr(router, "_routers", []):
        _require_object_bodies(sub_router)


def _object_body_model(model: Any) -> Any:
    """Return ninja's JSON body model ``model`` refusing a body that is not an object, or ``model`` unchanged.

    Unchanged: other parameters, multipart bodies and a single body parameter
    that is not a schema (``list[...]``, ``dict``, any JSON), which keep their own checks.
    """
    from ninja.params.models import BodyModel
    from pydantic import BaseModel

    if not (isinstance(model, type) and issubclass(model, BodyModel)):
        return model
    if model.get_request_data.__func__ is not BodyModel.get_request_data.__func__:  # type: ignore[attr-defined]
        return model  # multipart: read from request.POST and FILES
    single = getattr(model, "__read_from_single_attr__", None)
    if single:
        # ``body: XIn`` or ``body: XIn | None = None`` (an empty body stays allowed: data is None)
        annotation = model.model_fields[single].annotation
        optional = get_origin(annotation) in (Union, UnionType)
        kinds = [k for k in get_args(annotation) if k is not type(None)] if optional else [annotation]
        if not (len(kinds) == 1 and isinstance(kinds[0], type) and issubclass(kinds[0], BaseModel)):
            return model

    class ObjectBody(model):  # type: ignore[misc,valid-type]
        @classmethod
        def get_request_data(cls, request: HttpRequest, api: NinjaAPI, path_params: dict[str, Any]) -> Any:
            data = super().get_request_data(request, api, path_params)
            value = data.get(single) if single and isinstance(data, dict) else data
            if data is not None and not isinstance(value, dict):
                raise ValidationError("body", f"must be a JSON object, not {json_type(value)}")
            return data

    ObjectBody.__name__, ObjectBody.__qualname__ = model.__name__, model.__qualname__
    return ObjectBody


def _bind_prefix_path_params(router: Any, prefix: str) -> None:
    """Treat ``{tenant}`` (and any other ``{name}`` of the mount prefix) as a path parameter.

    django-ninja derives path parameters from the operation's own path only, so
    an operation's ``tenant: str`` would otherwise be read from the query string.
    Rebuilding the signature with the full path makes it a path parameter.
    """
    from ninja.signature import ViewSignature

    for path, path_view in router.path_operations.items():
        for operation in path_view.operations:
            operation.signature = ViewSignature(prefix + path, operation.view_func)
            operation.models = operation.signature.models
    for sub_prefix, sub_router, *_ in getattr(router, "_routers", []):
        _bind_prefix_path_params(sub_router, prefix + sub_prefix)


mount_routers()

__all__ = [
    "api",
    "CursorParams",
    "ErrorOut",
    "Page",
    "Query",
    "expected_version_field",
    "one_of",
    "principal",
    "requires",
]
