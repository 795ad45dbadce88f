"""Demo data: metric snapshots of ``tienda-bot`` from two replicas, pushed through the real API."""

from __future__ import annotations

import time
from typing import Any

BOT = "tienda-bot"
REPLICAS = ("tienda-bot-7d9f8c-x2k4p", "tienda-bot-7d9f8c-m8q1z")
POINTS = 12
STEP_MS = 5 * 60_000


def snapshot(step: int, replica_index: int) -> dict[str, Any]:
    """Return the ``bot.metrics()`` JSON (camelCase, as botmesh sends it) of one replica after ``step`` steps."""
    load = 1.0 + 0.5 * replica_index
    started = int(40 * step * load)
    ended = int(started * 0.9)
    return {
        "startedAt": int(time.time() * 1000) - (POINTS - 1) * STEP_MS - 3_600_000,
        "uptimeMs": 3_600_000 + step * STEP_MS,
        "conversations": {
            "started": started,
            "completed": int(ended * 0.8),
            "ended": int(ended * 0.1),
            "guarded": 1 if step > 4 else 0,
            "cancelled": step // 4,
            "timedOut": step // 3,
            "retriesExceeded": 0,
            "errored": step // 6,
            "avgDurationMs": 42_000 + 900 * step,
            "active": started - ended,
        },
        "flows": {
            "checkout": {"started": started // 3, "completed": started // 4, "avgDurationMs": 95_000},
            "order-status": {"started": started // 2, "completed": max(0, started // 2 - 1), "avgDurationMs": 8_000},
        },
        "messages": {"in": int(130 * step * load), "out": int(120 * step * load), "outFailed": step // 2},
        "dropped": {"duplicate": step, "blocked": step // 5, "handoff": 2 * step},
        "presenceSkipped": {"typing": step * 3, "markRead": step},
        "triggered": 6 * step,
        "errors": step // 6,
    }


def load(ctx: Any, tenant: str = "tienda") -> str:
    """Push ``POINTS`` snapshots per replica, five minutes apart, ending now; return a summary line."""
    now = int(time.time() * 1000)
    pushed = 0
    for index, replica in enumerate(REPLICAS):
        for step in range(POINTS):
            body = {**snapshot(step, index), "replica": replica, "at": now - (POINTS - 1 - step) * STEP_MS}
            status, answer = ctx.request("POST", f"/api/v1/tenants/{tenant}/bots/{BOT}/metrics", body, tenant=tenant)
            if status != 201:
                raise RuntimeError(f"observability demo: push answered {status}: {answer}")
            pushed += 1
    return f"observability: {pushed} metric snapshots of {BOT} from {len(REPLICAS)} replicas"
