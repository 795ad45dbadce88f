"""Demo data for deployments, loaded through the real API (``botmesh_admin.demo``).

Publishes the five fixture versions of ``tienda-bot`` as CI would, runs their
gates (1.0.0–1.2.0 pass; the 2.0.0-rc.1 pre-release is inconclusive on the
conversation replay and waits for manual approval), and activates 1.2.0.
"""

from __future__ import annotations

import json
from typing import Any

from botmesh_admin.demo import DEMO_TENANT

ACTIVE = "1.2.0"
RC_RESULTS = {"unit-tests": "succeeded", "conversation-replay": "inconclusive"}


def _ok(response: tuple[int, Any], what: str) -> Any:
    status, body = response
    if status >= 400:
        raise RuntimeError(f"deployments demo: {what} failed with {status}: {body}")
    return body


def load(ctx: Any) -> str:
    """Publish, gate and activate the fixture versions; return a one-line summary."""
    paths = sorted((ctx.fixtures / "deployments").glob("version_*.json"))
    published = 0
    for path in paths:
        spec = json.loads(path.read_text(encoding="utf-8"))
        base = f"/api/v1/tenants/{DEMO_TENANT}/bots/{spec['bot']}"
        status, version = ctx.request("POST", f"{base}/versions", spec)
        _ok((status, version), f"publish {spec['version']}")
        published += status == 201
        prerelease = "-" in spec["version"]
        for gate in version["gates"]:
            if gate["status"] not in ("pending", "running"):
                continue  # already decided on an earlier demo run
            result = RC_RESULTS.get(gate["name"]) if prerelease else "succeeded"
            if result is None:
                continue  # the pre-release waits for a human
            gate_url = f"{base}/versions/{spec['version']}/gates/{gate['name']}/runs"
            run = _ok(ctx.request("POST", gate_url, {"lease_ms": 600_000}), f"start {gate['name']}")
            body = {"result": result, "details": f"demo: {gate['name']} {result}"}
            _ok(ctx.request("POST", f"{gate_url}/{run['run_id']}", body), f"finish {gate['name']}")
    bot = json.loads(paths[0].read_text(encoding="utf-8"))["bot"] if paths else "tienda-bot"
    base = f"/api/v1/tenants/{DEMO_TENANT}/bots/{bot}"
    active = _ok(ctx.request("POST", f"{base}/versions/{ACTIVE}/activate", {}), f"activate {ACTIVE}")
    return f"deployments: {len(paths)} versions of {bot} ({published} new), gates run, {active['version']} active"
