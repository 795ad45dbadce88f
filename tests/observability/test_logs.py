"""Logs hash or drop customer ids, never show secrets, and can be JSON lines."""

from __future__ import annotations

import io
import json
import logging

import pytest

from botmesh_admin.observability.guard import hash_id
from botmesh_admin.observability.logs import IdFilter, JsonFormatter, RedactFilter, install

PHONE = "+573001112233"


def capture(mode: str | None = None, json_lines: bool = False) -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s chat=%(chat_id)s") if not json_lines else JsonFormatter())
    logger = logging.getLogger(f"test.obs.{id(stream)}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    handler.addFilter(IdFilter(mode))
    handler.addFilter(RedactFilter())
    return logger, stream


def test_ids_are_hashed_by_default(settings) -> None:  # type: ignore[no-untyped-def]
    settings.BOTMESH_LOG_IDS = "hashed"
    logger, stream = capture(json_lines=True)
    logger.info("sent", extra={"chat_id": PHONE, "sender_id": "12345678", "phone": PHONE, "attempt": 2})
    line = json.loads(stream.getvalue())
    assert line["chat_id"] == hash_id(PHONE) and line["phone"] == hash_id(PHONE)
    assert line["sender_id"] == hash_id("12345678")
    assert line["attempt"] == 2
    assert PHONE not in stream.getvalue()


def test_raw_mode_keeps_ids() -> None:
    logger, stream = capture("raw")
    logger.info("sent", extra={"chat_id": PHONE})
    assert stream.getvalue().strip() == f"sent chat={PHONE}"


def test_omit_mode_drops_ids() -> None:
    logger, stream = capture("omit", json_lines=True)
    logger.info("sent", extra={"chat_id": PHONE, "sender_id": "x"})
    line = json.loads(stream.getvalue())
    assert "chat_id" not in line and "sender_id" not in line


@pytest.mark.parametrize(
    "secret",
    [
        "bm_0a1b2c3d4e5f_Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZmdo",
        "Bearer abcdefghijklmnop123456",
        "123456789:AAHfiqksKZ8WmR2zSjiQ7_v4TMAKdiHm9T0",
        "EAAGm0PX4ZCpsBAKZAxyzABCDEFGHIJKLMNOP",
        "sha256=" + "a" * 64,
    ],
)
def test_secrets_in_messages_are_masked(secret: str) -> None:
    logger, stream = capture()
    logger.info("calling with %s now", secret, extra={"chat_id": None})
    assert secret not in stream.getvalue()
    assert "***" in stream.getvalue()


def test_secret_pairs_urls_and_extras_are_masked() -> None:
    logger, stream = capture(json_lines=True)
    logger.info(
        "config password=hunter2 url=redis://user:s3cr3t@redis:6379/0 app_secret: 'abc123'",
        extra={"access_token": "tok-123", "api_key": "k-9"},
    )
    out = stream.getvalue()
    for secret in ("hunter2", "s3cr3t", "abc123", "tok-123", "k-9"):
        assert secret not in out
    line = json.loads(out)
    assert line["access_token"] == "***" and "redis://user:***@redis" in line["message"]


def test_secrets_in_exceptions_are_masked() -> None:
    logger, stream = capture(json_lines=True)
    try:
        raise RuntimeError("Graph API refused token EAAGm0PX4ZCpsBAKZAxyzABCDEFGHIJKLMNOP")
    except RuntimeError:
        logger.exception("send failed")
    line = json.loads(stream.getvalue())
    assert "EAAGm0PX4ZCpsBAKZ" not in stream.getvalue()
    assert "RuntimeError" in line["exception"]


def test_json_lines_carry_the_trace_id() -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from botmesh_admin.observability import tracing

    logger, stream = capture(json_lines=True)
    with tracing.capture(InMemorySpanExporter()), tracing.span("message.send") as current:
        logger.info("sending")
    line = json.loads(stream.getvalue())
    assert line["trace_id"] == format(current.get_span_context().trace_id, "032x")
    assert line["level"] == "INFO" and line["message"] == "sending"


def test_install_puts_the_filters_on_every_root_handler_once() -> None:
    root = logging.getLogger("test.obs.install")
    handler = logging.StreamHandler(io.StringIO())
    root.addHandler(handler)
    install(root, json_lines=True)
    install(root, json_lines=True)
    assert sum(isinstance(f, IdFilter) for f in handler.filters) == 1
    assert sum(isinstance(f, RedactFilter) for f in handler.filters) == 1
    assert isinstance(handler.formatter, JsonFormatter)
    root.removeHandler(handler)


def test_a_send_log_and_its_trace_show_one_hash_of_the_chat(settings, caplog) -> None:  # type: ignore[no-untyped-def]
    """Regression for issue 15 item 11: providers logged 12 hex digits, traces 16; one chat, one hash now."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from botmesh_admin.channels.domain import OutboundMessage
    from botmesh_admin.channels.providers import ConsoleProvider
    from botmesh_admin.observability import tracing

    settings.BOTMESH_LOG_IDS = "hashed"
    chat_key = "whatsapp:573001112233"
    exporter = InMemorySpanExporter()
    with tracing.capture(exporter), caplog.at_level(logging.INFO, logger="botmesh.channels"):
        with tracing.span("message.send", chat_id=chat_key):
            assert ConsoleProvider("whatsapp").send(OutboundMessage(chat_key, text="hola")).accepted
    (sent,) = exporter.get_finished_spans()
    traced = sent.attributes["botmesh.chat_id_hash"]
    (line,) = [r.getMessage() for r in caplog.records if "accepted as" in r.getMessage()]
    assert f"send to {traced} accepted" in line and len(traced) == 16
    assert "573001112233" not in line

    settings.BOTMESH_LOG_IDS = "omit"
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="botmesh.channels"):
        ConsoleProvider("whatsapp").send(OutboundMessage(chat_key, text="hola"))
    assert "send to - accepted" in caplog.records[-1].getMessage()


@pytest.mark.parametrize(
    ("mode", "shown"),
    [
        ("hashed", f"whatsapp:{hash_id('whatsapp:573113243508')}"),
        ("omit", "whatsapp:-"),
        ("raw", "whatsapp:573113243508"),
    ],
)
def test_a_chat_key_in_a_logged_request_path_follows_the_id_mode(mode: str, shown: str) -> None:
    """A fresh user's report: Django logged ``Unprocessable Entity: …/handoff/whatsapp:573113243508`` raw."""
    logger, stream = capture(mode)
    path = "/api/v1/tenants/tienda/handoff/whatsapp:573113243508"
    logger.warning("Unprocessable Entity: %s", path, extra={"chat_id": None})
    logger.warning('"GET %s?q=telegram%%3A-1001234567890%%3A7000 HTTP/1.1" 422 93', path, extra={"chat_id": None})
    first, second = stream.getvalue().splitlines()
    assert first == f"Unprocessable Entity: /api/v1/tenants/tienda/handoff/{shown} chat=None"
    assert shown in second and ("573113243508" in second) == (mode == "raw")
    assert ("1001234567890" in second) == (mode == "raw")


def test_django_request_warnings_do_not_carry_a_raw_chat_key_in_json_lines(settings, client) -> None:  # type: ignore[no-untyped-def]
    """The ``request`` extra Django adds is written as its repr, masked like the message."""
    settings.BOTMESH_LOG_IDS = "hashed"
    logger, stream = capture(json_lines=True)
    request = client.get("/api/v1/tenants/nobody/handoff/whatsapp:573113243508").wsgi_request
    logger.warning("Not Found: %s", request.path, extra={"request": request, "status_code": 404})
    line = json.loads(stream.getvalue())
    assert "573113243508" not in stream.getvalue()
    assert line["message"].endswith(f"whatsapp:{hash_id('whatsapp:573113243508')}") and "WSGIRequest" in line["request"]


def test_django_and_runserver_lines_go_through_the_filtered_root_handler() -> None:
    """Django's defaults gave "django" a console handler of its own and left "django.server" with none and
    propagate off: Python's last-resort handler then printed runserver's 4xx lines, chat keys raw."""
    for name in ("django", "django.request", "django.server"):
        logger = logging.getLogger(name)
        assert logger.handlers == [] and logger.propagate, name
    # That install() filters the root's handlers is test_install_puts_the_filters_on_every_root_handler_once's:
    # which handlers the root holds here depends on the tests before (pytest's capture, a Celery worker's setup).


def test_credentials_stay_masked_after_the_wsgi_module_configures_logging_again(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A fresh user's report: runserver (``./dev run``) logged ``Unexpected auth - 'Basic YWRt…'`` (django-ninja,
    for an Authorization header that is no Bearer) in clear. runserver imports ``wsgi.py``, whose
    ``django.setup()`` configures logging again after ``ready()`` had filtered the handlers."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = (
        "import django, logging; django.setup()\n"
        "from botmesh_admin.wsgi import application\n"  # configures logging a second time, as runserver does
        "from django.test import Client\n"
        "Client().get('/api/v1/tenants/tienda/whoami', HTTP_AUTHORIZATION='Basic YWRtaW46Ym90bWVzaC1kZW1v')\n"
        "Client().get('/api/v1/tenants/tienda/whoami', HTTP_AUTHORIZATION='bm_990a5588804b_OjgY-V9pf2yLX6xlg6Ob')\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "botmesh_admin.settings", "BOTMESH_DATA_DIR": str(tmp_path)}
    env.pop("BOTMESH_LOG_IDS", None)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert "Unexpected auth - 'Basic ***'" in done.stderr, done.stderr[-2000:]
    assert "YWRtaW46" not in done.stderr and "OjgY-V9pf2yLX6xlg6Ob" not in done.stderr
