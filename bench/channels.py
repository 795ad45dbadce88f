"""Channels: inbound webhook verify+parse per second, outbound sends per second, each against a baseline.

Run ``.venv/bin/python bench/channels.py [--seconds 2]``. No server needed.

- inbound: ``whatsapp.verify_signature`` + ``json.loads`` + ``parse_webhook`` +
  ``to_json`` of every event of the batch fixture (3 messages), against the bare
  minimum a webhook must do (``hmac`` compare + ``json.loads``).
- outbound: ``WhatsAppProvider.send`` to the local ``FakeProviderServer``, against
  a raw ``urllib`` POST of the same JSON to the same server (reading the answer).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from botmesh_admin.channels import whatsapp  # noqa: E402
from botmesh_admin.channels.domain import OutboundMessage  # noqa: E402
from botmesh_admin.channels.providers import WhatsAppProvider  # noqa: E402
from botmesh_admin.channels.testing import FakeProviderServer  # noqa: E402
from botmesh_admin.demo import fixtures_dir  # noqa: E402


def rate(step: Callable[[], None], seconds: float) -> float:
    """Return calls of ``step`` per second over ``seconds`` (after a short warm-up)."""
    warm_until = time.perf_counter() + min(0.3, seconds / 5)
    while time.perf_counter() < warm_until:
        step()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            step()
        count += 10
    return count / (time.perf_counter() - start)


def compare(
    ours: Callable[[], None], baseline: Callable[[], None], seconds: float, rounds: int = 3
) -> tuple[float, float]:
    """Return the best rate of each over ``rounds`` alternating rounds (baseline first)."""
    best_ours = best_base = 0.0
    for _ in range(rounds):
        best_base = max(best_base, rate(baseline, seconds / rounds))
        best_ours = max(best_ours, rate(ours, seconds / rounds))
    return best_ours, best_base


def report(name: str, ours: float, baseline: float, unit: str) -> None:
    print(f"{name:<10} {ours:>10.0f} {unit}/s   baseline {baseline:>10.0f} {unit}/s   ratio {ours / baseline:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()

    fixtures = fixtures_dir()
    raw = (fixtures / "whatsapp" / "raw" / "08_batch.json").read_bytes()
    signatures = json.loads((fixtures / "whatsapp" / "raw" / "signatures.json").read_text())
    secret, header = signatures["app_secret"], signatures["signatures"]["08_batch.json"]

    def inbound() -> None:
        assert whatsapp.verify_signature(raw, header, secret)
        [e.to_json() for e in whatsapp.parse_webhook(json.loads(raw))]

    def inbound_baseline() -> None:
        digest = "sha256=" + hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(digest, header)
        json.loads(raw)

    report("inbound", *compare(inbound, inbound_baseline, args.seconds), "bodies")

    with FakeProviderServer() as fake:
        provider = WhatsAppProvider(fake.base_url, "106540352242922", "token")
        message = OutboundMessage("whatsapp:573001112233", text="hola")
        body = json.dumps(provider.payload(message)).encode()
        url = f"{fake.base_url}/106540352242922/messages"

        def outbound() -> None:
            assert provider.send(message).accepted

        def outbound_baseline() -> None:
            request = urllib.request.Request(
                url,
                data=body,
                method="POST",
                headers={"Content-Type": "application/json", "Authorization": "Bearer token"},
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                json.loads(response.read())

        report("outbound", *compare(outbound, outbound_baseline, args.seconds), "sends")


if __name__ == "__main__":
    main()
