"""A ``Transfer-Encoding: chunked`` body is read (gunicorn), or refused with 411/413 — never read as empty.

Regression (new user's report): a signed chunked WhatsApp webhook got 401
bad_signature, a chunked ``POST …/contacts`` 422 "body: Field required" and a
17 MB chunked body 422 instead of 413, because Django reads ``CONTENT_LENGTH``
only. Django's test client stands in for gunicorn by setting what gunicorn sets
(``wsgi.input_terminated``, no ``CONTENT_LENGTH``, a de-chunked ``wsgi.input``);
the last tests send real chunked framing to a real gunicorn. They also check a
bad ``Host`` answers JSON with DEBUG on and off while OpenTelemetry's middleware
(which reads the Host) runs.
"""

from __future__ import annotations

import io
import json
import socket
import subprocess
import threading
from pathlib import Path

import pytest
from django.test import Client

from botmesh_admin.demo import fixtures_dir
from botmesh_admin.events import connect_journal, use_journal

SIGNED = json.loads((fixtures_dir() / "whatsapp" / "raw" / "signatures.json").read_text())
RAW_TEXT = (fixtures_dir() / "whatsapp" / "raw" / "01_text.json").read_bytes()
ANA = json.dumps({"name": "Ana", "identities": [{"channel": "whatsapp", "address": "57 300 111 2233"}]}).encode()


def _chunked(client: Client, path: str, body: bytes, *, terminated: bool = True, **headers: str):
    """POST ``body`` the way a WSGI server hands over a chunked request (de-chunked when ``terminated``)."""
    environ = {"CONTENT_LENGTH": "", "HTTP_TRANSFER_ENCODING": "chunked", "wsgi.input": io.BytesIO(body)}
    if terminated:
        environ["wsgi.input_terminated"] = True
    return client.generic("POST", path, b"", content_type="application/json", **environ, **headers)


@pytest.fixture
def tienda(db) -> str:
    """Tenant ``tienda`` with the fixture WhatsApp number; return an API token."""
    from botmesh_admin.channels.services import channel_config_set
    from botmesh_admin.tenancy import services

    services.tenant_create("tienda", name="Tienda")
    channel_config_set("tienda", kind="whatsapp", name="main", phone_number_id="106540352242922",
                       app_secret=SIGNED["app_secret"])  # fmt: skip
    return services.token_create("tienda", name="ci")[1]


def _error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = json.loads(response.content)
    assert body["error"] == code and body["message"], body
    return body


def test_a_chunked_signed_webhook_is_verified_and_journaled(tienda: str) -> None:
    with use_journal(connect_journal("memory://")) as _:
        response = _chunked(Client(), "/webhooks/whatsapp/tienda", RAW_TEXT,
                            HTTP_X_HUB_SIGNATURE_256=SIGNED["signatures"]["01_text.json"])  # fmt: skip
    assert response.status_code == 200, response.content
    assert response.json()["received"] == 1


def test_a_chunked_contact_create_reads_its_body(tienda: str) -> None:
    response = _chunked(Client(), "/api/v1/tenants/tienda/contacts", ANA, HTTP_AUTHORIZATION=f"Bearer {tienda}")
    assert response.status_code == 201, response.content
    assert response.json()["name"] == "Ana"


def test_a_chunked_body_over_the_limit_is_json_413_and_one_at_it_is_read(tienda: str, settings) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = len(ANA)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {tienda}"}
    body = _error(_chunked(Client(), "/api/v1/tenants/tienda/contacts", ANA + b" ", **auth), 413, "too_large")
    assert body["field"] == "body"
    _error(_chunked(Client(), "/webhooks/whatsapp/tienda", b" " * (len(ANA) + 1)), 413, "too_large")
    assert _chunked(Client(), "/api/v1/tenants/tienda/contacts", ANA, **auth).status_code == 201


@pytest.mark.parametrize("path", ["/api/v1/tenants/tienda/contacts", "/webhooks/whatsapp/tienda"])
def test_a_chunked_body_the_server_cannot_dechunk_is_json_411(tienda: str, path: str) -> None:
    """runserver (wsgiref) does not de-chunk: 411, not a body read as empty."""
    body = _error(_chunked(Client(), path, RAW_TEXT, terminated=False), 411, "length_required")
    assert body["field"] == "body" and "Content-Length" in body["message"]


def test_a_chunked_body_outside_the_api_is_a_plain_411() -> None:
    response = _chunked(Client(), "/login/", b"x=1", terminated=False)
    assert response.status_code == 411 and not response["Content-Type"].startswith("application/json")


@pytest.mark.parametrize("debug", [True, False])
@pytest.mark.parametrize("path", ["/api/v1/tenants/tienda/whoami", "/webhooks/whatsapp/tienda"])
def test_a_disallowed_host_is_json_400_with_debug_on_and_off(settings, debug: bool, path: str) -> None:
    settings.DEBUG = debug
    body = _error(Client().get(path, HTTP_HOST="evil.example"), 400, "bad_request")
    assert body["field"] == "Host" and "evil.example" in body["message"]


# -- gunicorn ---------------------------------------------------------------------------


def _send(port: int, head: bytes, body_chunks: list[bytes] = ()) -> tuple[int, str, bytes]:  # type: ignore[assignment]
    """Send ``head`` and the chunked ``body_chunks`` (from a thread: the server may answer first)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:

        def write() -> None:
            try:
                sock.sendall(head)
                for chunk in body_chunks:
                    sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                if body_chunks:
                    sock.sendall(b"0\r\n\r\n")
            except OSError:  # the server answered 413 and closed: what the test wants to see
                pass

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        writer.join(30)
    head_text, _, body = data.partition(b"\r\n\r\n")
    lines = head_text.decode("latin1").split("\r\n")
    headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:] if ": " in line)}
    if headers.get("transfer-encoding") == "chunked":  # an answer without Content-Length
        chunks, rest = [], body
        while (size := int(rest.split(b"\r\n", 1)[0], 16)) > 0:
            rest = rest.split(b"\r\n", 1)[1]
            chunks.append(rest[:size])
            rest = rest[size + 2 :]
        body = b"".join(chunks)
    return int(lines[0].split()[1]), headers.get("content-type", ""), body


SETUP = """
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from botmesh_admin.channels.services import channel_config_set
from botmesh_admin.tenancy import services
services.tenant_create("tienda", name="Tienda")
channel_config_set("tienda", kind="whatsapp", name="main", phone_number_id="106540352242922", app_secret=%r)
print(services.token_create("tienda", name="ci")[1])
"""


def test_gunicorn_reads_chunked_bodies_and_answers_json_413_and_host_400(tmp_path: Path) -> None:
    """DEBUG on, as in development (off, a bad Host reached handler400 and was JSON already)."""
    from tests.faults.servers import ROOT, Processes, free_port, project_env, python

    env = project_env(tmp_path)
    env.pop("OTEL_SDK_DISABLED")  # tracing on, as in development: its middleware reads the Host first
    env["DEBUG"] = "1"
    (tmp_path / "data").mkdir()
    token = subprocess.run([python(), "-c", SETUP % SIGNED["app_secret"]], cwd=ROOT, env=env, check=True,
                           capture_output=True, text=True, timeout=60).stdout.split()[-1]  # fmt: skip
    with Processes(tmp_path) as procs:
        port = free_port()
        procs.start("web", [python(), "-m", "gunicorn", "botmesh_admin.wsgi", "-b", f"127.0.0.1:{port}",
                                  "-w", "1", "--log-level", "warning"], env)  # fmt: skip
        procs.wait_healthz("web", port)

        def post(path: str, chunks: list[bytes], *headers: str) -> tuple[int, str, bytes]:
            head = "".join(f"{h}\r\n" for h in (f"POST {path} HTTP/1.1", "Host: 127.0.0.1",
                           "Transfer-Encoding: chunked", "Content-Type: application/json", *headers))  # fmt: skip
            return _send(port, head.encode() + b"\r\n", chunks)

        signature = "X-Hub-Signature-256: " + SIGNED["signatures"]["01_text.json"]
        status, _, body = post("/webhooks/whatsapp/tienda", [RAW_TEXT[:100], RAW_TEXT[100:]], signature)
        assert (status, json.loads(body)["received"]) == (200, 1), body

        auth = f"Authorization: Bearer {token}"
        status, _, body = post("/api/v1/tenants/tienda/contacts", [ANA[:10], ANA[10:]], auth)
        assert status == 201 and json.loads(body)["name"] == "Ana", body

        status, content_type, body = post("/api/v1/tenants/tienda/contacts", [b" " * (1 << 20)] * 17, auth)
        assert (status, content_type) == (413, "application/json"), body[:300]
        assert json.loads(body)["error"] == "too_large"

        for path in ("/api/v1/tenants/tienda/whoami", "/webhooks/whatsapp/tienda"):
            status, content_type, body = _send(port, f"GET {path} HTTP/1.1\r\nHost: evil.example\r\n\r\n".encode())
            assert (status, content_type) == (400, "application/json"), body[:300]
            assert json.loads(body)["error"] == "bad_request"
