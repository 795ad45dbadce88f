"""Send outcomes: what every provider answer means, from the one code table in ``channels.domain``.

The providers are driven over real HTTP against the local fake provider server;
codes the fake does not answer with are checked on ``send_outcome`` itself. A
last test reads the inbox and campaigns sources: no package keeps a code table
of its own.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from botmesh_admin.channels.domain import (
    OUTCOME_OF_CODE,
    SEND_HINTS,
    OutboundMessage,
    SendOutcome,
    SendResult,
    blocked_identity,
    send_outcome,
)
from botmesh_admin.channels.providers import TelegramProvider, WhatsAppProvider

from .conftest import TG_BOT_TOKEN as TOKEN
from .conftest import WA_PHONE_NUMBER_ID as PHONE_ID

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("answer", "outcome", "retry_after_s", "hint"),
    [
        ("accepted", SendOutcome.ACCEPTED, None, ""),
        ("window_closed", SendOutcome.WINDOW_CLOSED, None, "24-hour window closed: the customer must write first"),
        ("rate_limited", SendOutcome.RATE_LIMITED, 1.0, "rate limited by WhatsApp"),
        ("bad_token", SendOutcome.BAD_CREDENTIALS, None, "the access token expired"),
        ("drop", SendOutcome.NO_ANSWER, 1.0, "no answer from the provider: it may or may not have been delivered"),
    ],
)
def test_whatsapp_answers_map_to_outcomes(fake, answer, outcome, retry_after_s, hint) -> None:
    fake.script("573001112233", answer)
    provider = WhatsAppProvider(fake.base_url, PHONE_ID, "EAAG-token", timeout_s=2)
    result = provider.send(OutboundMessage("whatsapp:573001112233", text="hola"))
    assert (result.outcome, result.retry_after_s) == (outcome, retry_after_s)
    assert result.hint.startswith(hint) and bool(result.hint) == bool(hint)


@pytest.mark.parametrize(
    ("answer", "outcome", "retry_after_s", "hint"),
    [
        ("accepted", SendOutcome.ACCEPTED, None, ""),
        ("blocked", SendOutcome.BLOCKED, None, "the user blocked the bot"),
        ("rate_limited", SendOutcome.RATE_LIMITED, 3.0, "rate limited"),  # parameters.retry_after: 3
        ("chat_not_found", SendOutcome.FAILED, None, "chat not found"),
        ("drop", SendOutcome.NO_ANSWER, 1.0, "no answer from the provider: it may or may not have been delivered"),
    ],
)
def test_telegram_answers_map_to_outcomes(fake, answer, outcome, retry_after_s, hint) -> None:
    fake.script("700000001", answer)
    result = TelegramProvider(fake.base_url, TOKEN, timeout_s=2).send(OutboundMessage("telegram:700000001", text="x"))
    assert (result.outcome, result.retry_after_s, result.hint) == (outcome, retry_after_s, hint)


@pytest.mark.parametrize(
    ("channel", "code", "retryable", "outcome"),
    [
        ("whatsapp", 131047, False, SendOutcome.WINDOW_CLOSED),  # re-engagement message (24 h)
        ("whatsapp", 131026, False, SendOutcome.FAILED),  # undeliverable: WhatsApp never says "blocked"
        ("whatsapp", 131049, False, SendOutcome.FAILED),  # held back for healthy ecosystem engagement
        ("whatsapp", 130429, True, SendOutcome.RATE_LIMITED),  # Cloud API throughput
        ("whatsapp", 131056, True, SendOutcome.RATE_LIMITED),  # business/consumer pair rate limit
        ("whatsapp", 131048, True, SendOutcome.RATE_LIMITED),  # spam rate limit
        ("whatsapp", 80007, True, SendOutcome.RATE_LIMITED),
        ("whatsapp", 4, True, SendOutcome.RATE_LIMITED),
        ("whatsapp", 190, False, SendOutcome.BAD_CREDENTIALS),  # access token expired
        ("whatsapp", 403, False, SendOutcome.FAILED),  # an HTTP 403 is no Telegram block
        ("whatsapp", 131000, True, SendOutcome.FAILED),  # something went wrong: retryable, no outcome of its own
        ("telegram", 403, False, SendOutcome.BLOCKED),
        ("telegram", 401, False, SendOutcome.BAD_CREDENTIALS),
        ("telegram", 429, True, SendOutcome.RATE_LIMITED),
        ("telegram", 400, False, SendOutcome.FAILED),
        ("telegram", 502, True, SendOutcome.FAILED),
        ("telegram", 190, False, SendOutcome.FAILED),  # a WhatsApp code means nothing on Telegram
        ("telegram", None, True, SendOutcome.NO_ANSWER),
        ("whatsapp", None, False, SendOutcome.FAILED),  # nothing sent (a refused base URL): a sure failure
    ],
)
def test_the_code_table(channel, code, retryable, outcome) -> None:
    assert send_outcome(channel, status="failed", error_code=code, retryable=retryable) is outcome


def test_a_result_derives_outcome_delay_and_hint_and_round_trips_through_json() -> None:
    result = SendResult(status="failed", chat_key="whatsapp:573001112233", error_code=131026, error_title="x")
    assert result.outcome is SendOutcome.FAILED and result.hint.startswith("undeliverable: not a WhatsApp number")
    limited = SendResult(
        status="failed", chat_key="telegram:7", error_code=429, retryable=True, retry_after_ms=2500, error_title="slow"
    )
    assert (limited.outcome, limited.retry_after_s, limited.hint) == (SendOutcome.RATE_LIMITED, 2.5, "rate limited")
    for r in (result, limited, SendResult(status="accepted", chat_key="telegram:7", provider_message_id="b:7:1")):
        assert SendResult.from_json(json.loads(json.dumps(r.to_json()))) == r
    assert SendResult(status="accepted", chat_key="telegram:7").hint == ""


def test_a_block_is_about_the_user_of_a_private_chat_only() -> None:
    assert blocked_identity("telegram:700000001") == "700000001"
    assert blocked_identity("telegram:-1001234567890:700000002") is None  # the bot left the group
    assert blocked_identity("whatsapp:573001112233") == "+573001112233"


def _int_literals(path: Path) -> set[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and type(n.value) is int}


def test_inbox_and_campaigns_keep_no_error_code_table() -> None:
    codes = {c for table in OUTCOME_OF_CODE.values() for c in table} | set(SEND_HINTS)
    provider_codes = {c for c in codes if c >= 1000 or c == 190}  # not HTTP statuses or small numbers
    offenders = {}
    for app in ("inbox", "campaigns"):
        for path in sorted((ROOT / app).rglob("*.py")):
            found = _int_literals(path) & provider_codes
            if found:
                offenders[str(path.relative_to(ROOT))] = sorted(found)
    assert offenders == {}, "provider codes belong to channels.domain (send_outcome, send_hint)"
