"""Hub and deployments: manifest checks, enable/disable and activate/rollback per second, each
against a baseline measured in the same run on the same Kv.

Run ``.venv/bin/python bench/hub_deployments.py [--seconds 2] [--kv URL]`` (default: a
temporary SQLite Kv; pass ``$BOTMESH_TEST_POSTGRES_URL`` or a ``redis://`` URL to measure a server).

- manifest: ``parse_manifest`` (size bound, duplicate-key check, every field, node-semver
  range) of ``order-status.json`` against a bare ``json.loads`` of the same bytes.
- enable: ``plugin_enable`` then ``plugin_disable`` (read, re-check grants, CAS + audit in one
  commit) against the bare minimum: ``kv.get`` + one compare-and-set ``Put`` of the same record.
- activate: ``deployment_activate`` alternating two passed versions (read version and
  pointer, CAS on the pointer guarded by a Check on the version, audit) against ``kv.get`` +
  one compare-and-set ``Put`` of the pointer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import os  # noqa: E402

import django  # noqa: E402

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "botmesh_admin.settings")
django.setup()

from botmesh_admin.demo import fixtures_dir  # noqa: E402
from botmesh_admin.kv import Put, connect  # noqa: E402
from deployments import selectors as deployment_selectors  # noqa: E402
from deployments import services as deployments  # noqa: E402
from deployments.stores import use_store as use_deployment_store  # noqa: E402
from deployments.stores.kv import KvDeploymentStore  # noqa: E402
from hub import selectors as hub_selectors  # noqa: E402
from hub import services as hub  # noqa: E402
from hub.domain import current_runtime, parse_manifest  # noqa: E402
from hub.stores import use_store as use_plugin_store  # noqa: E402
from hub.stores.kv import KvPluginStore  # noqa: E402


def rate(step: Callable[[], None], seconds: float) -> float:
    """Return calls of ``step`` per second over ``seconds`` (after a short warm-up)."""
    warm_until = time.perf_counter() + min(0.3, seconds / 5)
    while time.perf_counter() < warm_until:
        step()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        count += 1
    return count / (time.perf_counter() - start)


def compare(ours: Callable[[], None], baseline: Callable[[], None], seconds: float) -> tuple[float, float]:
    """Return the best rate of each over three alternating rounds (baseline first)."""
    best_ours = best_base = 0.0
    for _ in range(3):
        best_base = max(best_base, rate(baseline, seconds / 3))
        best_ours = max(best_ours, rate(ours, seconds / 3))
    return best_ours, best_base


def raw_cas(kv, table: str, key: str, value: dict) -> Callable[[], None]:
    """The baseline: read the key, write it back with a compare-and-set on its version."""

    def step() -> None:
        entry = kv.get(table, key)
        kv.commit(table, [Put(key, value, expect=entry.version)])

    kv.commit(table, [Put(key, value)])
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--kv", default=None, help="Kv URL (default: a temporary SQLite file)")
    args = parser.parse_args()
    url = args.kv or f"sqlite:///{tempfile.mkdtemp(prefix='bench-hub-')}/kv.sqlite3"
    kv = connect(url)
    tenant = f"bench-{uuid.uuid4().hex[:8]}"
    runtime = current_runtime()
    raw = (fixtures_dir() / "hub" / "valid" / "order-status.json").read_bytes()
    results = []

    ours, base = compare(lambda: parse_manifest(raw, runtime=runtime), lambda: json.loads(raw), args.seconds)
    results.append(("manifest parse+validate", ours, "json.loads", base))

    stores = contextlib.ExitStack()  # the benchmark's Kv for the services, for the rest of the run
    stores.enter_context(use_plugin_store(KvPluginStore(kv)))
    stores.enter_context(use_deployment_store(KvDeploymentStore(kv)))
    inst, _ = hub.plugin_install(tenant, manifest=raw, actor="bench")
    hub.plugin_grant(tenant, inst.plugin_id, permissions=list(inst.manifest.permissions), actor="bench")
    flip = [False]

    def toggle() -> None:
        flip[0] = not flip[0]
        (hub.plugin_enable if flip[0] else hub.plugin_disable)(tenant, inst.plugin_id, actor="bench")

    record = hub_selectors.plugin_get(tenant, inst.plugin_id).to_json()
    baseline = raw_cas(kv, f"bench/{tenant}/raw", "plugin/acme.order-status", record)
    ours, base = compare(toggle, baseline, args.seconds)
    results.append(("plugin enable/disable", ours, "kv get + CAS put", base))

    folder = fixtures_dir() / "deployments"
    specs = [json.loads((folder / f"version_{i}.json").read_text()) for i in (1, 2)]
    for spec in specs:
        deployments.version_publish(tenant, spec=spec, actor="bench")
        for gate in spec["gates"]:
            run = deployments.gate_run_start(tenant, spec["bot"], spec["version"], gate, actor="bench")
            deployments.gate_run_finish(
                tenant,
                spec["bot"],
                spec["version"],
                gate,
                run_id=run.run_id,
                result="succeeded",
                actor="bench",
            )
    turn = [0]

    def switch() -> None:
        turn[0] ^= 1
        deployments.deployment_activate(tenant, "tienda-bot", specs[turn[0]]["version"], actor="bench")

    switch()
    pointer = deployment_selectors.deployment_active(tenant, "tienda-bot").to_json()
    baseline = raw_cas(kv, f"bench/{tenant}/raw", "active/tienda-bot", pointer)
    ours, base = compare(switch, baseline, args.seconds)
    results.append(("activate (alternating)", ours, "kv get + CAS put", base))

    print(f"Kv: {url.split('@')[-1]}")
    for name, ours, base_name, base in results:
        print(f"{name:26} {ours:10.0f} ops/s   {base_name:18} {base:10.0f} ops/s   ratio {ours / base:.2f}")
    KvPluginStore(kv).drop_tenant(tenant)
    KvDeploymentStore(kv).drop_tenant(tenant)
    kv.drop(f"bench/{tenant}/raw")
    stores.close()
    kv.close()


if __name__ == "__main__":
    main()
