"""Every API and webhook path answers its errors in the one JSON shape (issue 18, item 2).

400, 404, 405 and 413 come from Django and ninja (through ``JsonErrorMiddleware``);
414 and 431 from gunicorn itself, before Django runs (``install_gunicorn_json_errors``),
so those are checked against a real gunicorn. The ``after`` cursor's schema bound
fits gunicorn's request line even when every character is a 4-byte one.
"""

from __future__ import annotations

import re
import socket
import urllib.parse
from pathlib import Path

import pytest
from django.test import Client

from botmesh_admin.api import CURSOR_MAX_CHARS, api
from botmesh_admin.httperrors import GUNICORN_REQUEST_LINE_BYTES

SHAPE = {"error", "message", "field"}
METHODS = ("get", "post", "put", "patch", "delete")


def _openapi() -> dict:
    return api.get_openapi_schema(path_prefix="/api/v1")


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x1", path)


def _assert_json_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, (response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = response.json()
    assert SHAPE <= set(body) and body["error"] == code, body
    return body


def test_every_api_path_answers_a_method_it_lacks_with_json_405() -> None:
    """ninja's own 405 was text/html "Method not allowed"; ``Allow`` still names the methods."""
    client = Client()
    paths = _openapi()["paths"]
    assert len(paths) > 40
    for path, operations in paths.items():
        missing = next(m for m in METHODS if m not in operations)
        response = getattr(client, missing)(_concrete(path))
        body = _assert_json_error(response, 405, "method_not_allowed")
        assert set(response["Allow"].split(", ")) == {m.upper() for m in operations}, path
        assert body["message"] == "method not allowed"


@pytest.mark.parametrize("path", ["/webhooks/telegram/acme/main", "/webhooks/whatsapp/acme"])
def test_webhooks_answer_a_method_they_lack_with_json_405(path: str) -> None:
    response = Client().put(path, b"{}", content_type="application/json")
    _assert_json_error(response, 405, "method_not_allowed")
    assert "POST" in response["Allow"]


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/nope",
        "/api/v1/tenants/acme/nope",
        "/api/v1/tenants/acme/contacts/a/b/c",
        "/webhooks/nope",
        "/webhooks/telegram/acme",
    ],
)
def test_paths_no_route_matches_are_json_404(path: str) -> None:
    _assert_json_error(Client().get(path), 404, "not_found")


def test_pages_outside_the_api_keep_django_html_errors() -> None:
    response = Client().get("/no-such-page/")
    assert response.status_code == 404 and not response["Content-Type"].startswith("application/json")


@pytest.mark.parametrize("path", ["/api/v1/tenants/acme/whoami", "/webhooks/whatsapp/acme"])
def test_a_disallowed_host_is_json_400(path: str) -> None:
    _assert_json_error(Client().get(path, HTTP_HOST="evil.example"), 400, "bad_request")


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/tenants/acme/ledger",
        "/api/v1/tenants/acme/contacts",
        "/webhooks/whatsapp/acme",
        "/webhooks/telegram/acme/main",
    ],
)
def test_a_body_over_the_upload_limit_is_json_413(path: str, settings, db) -> None:
    from botmesh_admin.channels.services import channel_config_set
    from botmesh_admin.tenancy import services

    services.tenant_create("acme", name="ACME")
    token = services.token_create("acme", name="ci")[1]
    channel_config_set("acme", kind="whatsapp", name="wa", phone_number_id="106540352242922",
                       app_secret="s" * 32, verify_token="verify-me-1234", access_token="EAAG-x")  # fmt: skip
    channel_config_set("acme", kind="telegram", name="main", bot_username="acme_bot",
                       bot_token="600000000:AAF-fixture-bot-token-not-real-xyz", webhook_secret="w" * 32)  # fmt: skip
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    response = Client().post(path, b"[" + b"1," * 2000 + b"1]", content_type="application/json",
                             HTTP_AUTHORIZATION=f"Bearer {token}",
                             HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN="w" * 32)  # fmt: skip
    body = _assert_json_error(response, 413, "too_large")
    assert body["field"] == "body"


def _bytes_per_char(pattern: str | None) -> int:
    """Request-line bytes of one character a cursor ``pattern`` admits, at worst.

    No pattern: 12 (a 4-byte UTF-8 character, each byte percent-encoded as ``%XX``).
    A pattern built only of URL-safe literals and classes (RFC 3986 unreserved:
    ``A-Za-z0-9-_``, never percent-encoded): 1. Anything else: 12.
    """
    if pattern and "[^" not in pattern and re.fullmatch(r"[\^$()|A-Za-z0-9_{},\[\]-]+", pattern):
        return 1
    return 12


def test_the_cursor_bound_fits_the_request_line_in_any_characters() -> None:
    """Issue 18, item 2: 512 non-ASCII characters of ``after`` exceeded gunicorn's 4,094 bytes (HTML 414)."""
    seen = 0
    for path, operations in _openapi()["paths"].items():
        for method, operation in operations.items():
            for param in operation.get("parameters", []):
                if param["name"] != "after":
                    continue
                schema = next((s for s in param["schema"].get("anyOf", []) if s.get("type") == "string"),
                              param["schema"])  # fmt: skip
                assert "maxLength" in schema, f"{method} {path}: after has no maxLength"
                seen += 1
                path_bytes = len(re.sub(r"\{[^}]+\}", "x" * 64, path))
                line = len(f"{method.upper()} {path_bytes * 'x'}?limit=200&after= HTTP/1.1")
                worst = line + schema["maxLength"] * _bytes_per_char(schema.get("pattern"))
                assert worst <= GUNICORN_REQUEST_LINE_BYTES - 512, (method, path, worst)
    assert seen >= 10


# -- gunicorn ---------------------------------------------------------------------------


def _raw(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def test_gunicorn_answers_414_and_431_in_json_and_a_cursor_at_its_bound_gets_through(tmp_path: Path) -> None:
    import json

    from tests.faults.servers import Processes, free_port, project_env, python

    with Processes(tmp_path) as procs:
        port = free_port()
        env = project_env(tmp_path)
        (tmp_path / "data").mkdir()
        procs.start("web", [python(), "-m", "gunicorn", "botmesh_admin.wsgi", "-b", f"127.0.0.1:{port}",
                                  "-w", "1", "--log-level", "warning"], env)  # fmt: skip
        procs.wait_healthz("web", port)

        status, headers, body = _raw(port, b"GET /api/v1/tenants/acme/contacts?after=" + b"a" * 5000
                                     + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")  # fmt: skip
        assert (status, headers["content-type"]) == (414, "application/json"), body
        assert json.loads(body)["error"] == "uri_too_long"

        status, headers, body = _raw(port, b"GET /api/v1/tenants/acme/whoami HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                     + b"X-Big: " + b"b" * 9000 + b"\r\n\r\n")  # fmt: skip
        assert (status, headers["content-type"]) == (431, "application/json"), body
        assert json.loads(body)["error"] == "headers_too_large"

        after = urllib.parse.quote("😀" * CURSOR_MAX_CHARS)
        status, headers, body = _raw(port, f"GET /api/v1/tenants/acme/conversations?limit=200&after={after} "
                                     "HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())  # fmt: skip
        assert status == 401 and json.loads(body)["error"] == "unauthenticated", (status, body[:200])


def test_the_dev_server_answers_its_own_414_and_431_in_json_too(tmp_path: Path) -> None:
    """Found by a new user: ``./dev run``'s runserver answered these with HTML pages (gunicorn in JSON)."""
    import json

    from tests.faults.servers import Processes, free_port, project_env, python

    with Processes(tmp_path) as procs:
        port = free_port()
        (tmp_path / "data").mkdir()
        procs.start("web", [python(), "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
                          project_env(tmp_path))  # fmt: skip
        procs.wait_healthz("web", port)

        status, headers, body = _raw(port, b"GET /api/v1/tenants/acme/contacts?after=" + b"a" * 70_000
                                     + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")  # fmt: skip
        assert (status, headers["content-type"]) == (414, "application/json"), body
        assert json.loads(body)["error"] == "uri_too_long"

        status, headers, body = _raw(port, b"GET /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # a page, not the API
                                     + b"X-Big: " + b"b" * 70_000 + b"\r\n\r\n")  # fmt: skip
        assert (status, headers["content-type"]) == (431, "application/json"), body
        assert json.loads(body) == {
            "error": "headers_too_large",
            "field": None,
            "message": "Line too long: got more than 65536 bytes when reading header line",
        }

        many = b"".join(b"X-H%d: 1\r\n" % i for i in range(101))
        status, headers, body = _raw(port, b"GET /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n" + many + b"\r\n")
        assert (status, headers["content-type"]) == (431, "application/json"), body
        assert json.loads(body)["error"] == "headers_too_large"
