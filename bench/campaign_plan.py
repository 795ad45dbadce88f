"""Planning a campaign over N contacts: peak memory (RSS) and time, against holding just the contact ids.

Run ``.venv/bin/python bench/campaign_plan.py [--contacts 100000] [--kv URL]``
(``--contacts 1000000`` for the million; for PostgreSQL ``--kv "$BOTMESH_TEST_POSTGRES_URL"``
after ``eval "$(scripts/services.sh)"``; the default is a SQLite file in a
temporary folder). Setup writes the contacts through the CRM store
(``KvContactStore.contact_insert_batch``, 500 per commit, with its index
upkeep): 80% opted in, 10% opted out, 10% outside the segment. The CRM's
index upkeep makes that slow at 10^6 on a loaded 2-core box (about 100-400
contacts/s); ``--raw-setup`` writes the same records (the CRM store's own
JSON and identity claims) straight into its table without that upkeep,
1,000 per commit. The phases read contacts by scan, so what they measure is
the same either way.

Each measured phase runs in a fresh process, so its peak RSS
(``resource.getrusage(...).ru_maxrss``) is its own; since loading Django
already sets a peak, each phase also resets the kernel's high-water mark once
loaded (``/proc/self/clear_refs``) and reports its own growth: the peak during
the phase minus the RSS it started with.

- **floor**: the process with Django and the apps loaded, nothing read;
- **baseline**: every contact id read through ``crm.selectors.contact_iter``
  into a Python list (what holding the audience costs, at the least);
- **preview**: ``campaigns.selectors.campaign_plan`` — the whole audience
  judged, exact counts, duplicates found by ``SeenKeys`` (spills to a
  temporary SQLite file), the first 1,000 recipients kept;
- **run plan**: ``campaigns.services.planning._materialize`` — what a campaign's first
  run does: the plan streamed into the slot store (a plan record and a pending
  slot per recipient, with the slots' index upkeep), then the plan's counts;
- **unbounded**: ``Planner.plan()`` keeping every recipient in memory (the
  planner's shape before it streamed), for comparison.

Printed per phase: peak RSS, the phase's growth, time, and the growth as a
multiple of the baseline's. Bounded means the preview's and the
run's figures stay flat as ``--contacts`` grows, while the baseline's and the
unbounded plan's grow with it.

Measured on the 2-core dev box, SQLite, while other work loaded it (load
8-12, so the times are slow and noisy; the memory is not); growth over the
process once loaded (floor: 78-82 MB peak RSS):

=========  ==================  ==================  ================
phase      100,000 contacts    1,000,000           growth 10^5→10^6
=========  ==================  ==================  ================
baseline   13.3 MB, 30 s       89.1 MB, 179 s      6.7×
preview    10.1 MB, 33 s       11.5 MB, 276 s      1.1×
run plan    4.8 MB, 191 s       5.3 MB, 932 s      1.1×
unbounded  34.1 MB, 28 s      293.0 MB, 203 s      8.6×
=========  ==================  ==================  ================

(1,000,000 with ``--raw-setup``: 800,000 recipients, 800,000 slots written.)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "botmesh_admin.settings")
os.environ.setdefault("CELERY_BROKER_URL", "memory://")

PHASES = ("floor", "baseline", "preview", "run plan", "unbounded")


def setup_django(url: str) -> Any:
    """Load Django over the Kv at ``url``; return the connected Kv."""
    os.environ["BOTMESH_KV_URL"] = url
    import django

    django.setup()
    from botmesh_admin.kv import connect

    return connect(url)


def seed(url: str, tenant: str, n: int, *, raw: bool = False) -> tuple[str, str]:
    """Write ``n`` contacts (through the CRM store, or ``raw``), a segment and a draft campaign; return their ids."""
    kv = setup_django(url)
    from botmesh_admin.kv import ABSENT, Put, TenantKv
    from botmesh_admin.kv.runtime import use_kv
    from campaigns import services
    from crm import selectors as crm_selectors
    from crm import services as crm
    from crm.domain import Consent, Contact, Identity, new_id
    from crm.stores.kv import KvContactStore

    crm_selectors._regions[tenant] = ("CO", float("inf"))
    store = KvContactStore(kv)
    table = TenantKv(kv, "crm").table(tenant, "contacts")
    size = 1000 if raw else 500
    start = time.perf_counter()
    for first in range(0, n, size):
        batch = []
        for i in range(first, min(n, first + size)):
            status = "denied" if i % 10 == 3 else "granted"
            batch.append(
                Contact(
                    id=new_id("c"),
                    identities=(Identity("whatsapp", f"+57{3000000000 + i}"),),
                    name=f"Cliente {i}",
                    tags=("vip",) if i % 10 == 7 else ("promo",),
                    consent={"whatsapp": Consent("whatsapp", status, 1, "b")},
                    created_at=1,
                    updated_at=1,
                )
            )
        if raw:  # the CRM store's records and identity claims, without its index upkeep
            kv.commit(
                table,
                [
                    op
                    for c in batch
                    for op in (
                        Put(f"c/{c.id}", c.to_json(), ABSENT),
                        *(Put(f"i/{i.key}", {"contact": c.id}, ABSENT) for i in c.identities),
                    )
                ],
            )
        else:
            store.contact_insert_batch(tenant, batch)
        if first % 50_000 == 0:
            print(f"\r  setup: {first + len(batch):,} contacts", end="", flush=True)
    how = "straight into the CRM's table" if raw else "through the CRM store"
    print(f"\r  setup: {n:,} contacts written {how} in {time.perf_counter() - start:.1f} s")
    with use_kv(kv):
        segment = crm.segment_create(tenant, name="Promo", rules={"tags_all": ["promo"]})
        campaign = services.campaign_create(
            tenant,
            name="Bench",
            segment_id=segment.id,
            channel="whatsapp",
            message={"template": "promo_nov", "language": "es"},
        )
    kv.close()
    return segment.id, campaign.id


def status_kb(field: str) -> int:
    """Return ``VmRSS`` / ``VmHWM`` of this process from ``/proc/self/status`` (kB; 0 elsewhere than Linux)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark to the current RSS (Linux ``clear_refs`` 5); False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def phase(name: str, url: str, tenant: str, segment_id: str, campaign_id: str) -> dict[str, Any]:
    """Run one phase in this (fresh) process; return its figures."""
    kv = setup_django(url)
    from botmesh_admin.kv.runtime import use_kv
    from campaigns import selectors
    from campaigns.domain.planning import Planner
    from campaigns.services import planning
    from crm import selectors as crm_selectors

    crm_selectors._regions[tenant] = ("CO", float("inf"))
    result: dict[str, Any] = {}
    with use_kv(kv):
        if name != "unbounded":
            Planner(tenant).plan(
                rules=crm_selectors.segment_get(tenant, segment_id).rules, channel="whatsapp", contact_ids=[], keep=0
            )  # warm the code paths: lazy imports are not the plan
        started_kb = status_kb("VmRSS")
        own_peak = reset_peak()
        start = time.perf_counter()
        if name == "baseline":
            ids = [c.id for c in crm_selectors.contact_iter(tenant)]
            result["contacts"] = len(ids)
        elif name == "preview":
            plan = selectors.campaign_plan(tenant, segment_id=segment_id, channel="whatsapp")
            result.update(plan.counts.to_json(), kept=len(plan.recipients))
        elif name == "run plan":
            campaign = selectors.campaign_get(tenant, campaign_id)
            done = planning._materialize(tenant, campaign, Planner(tenant))
            progress = selectors.campaign_progress(tenant, campaign_id).counts
            assert done.plan is not None and progress.total == done.plan.recipients, (done.plan, progress)
            result.update(done.plan.to_json(), slots=progress.total)
        elif name == "unbounded":
            segment = crm_selectors.segment_get(tenant, segment_id)
            plan = Planner(tenant).plan(rules=segment.rules, channel="whatsapp")
            result.update(plan.counts.to_json(), kept=len(plan.recipients))
        result["seconds"] = time.perf_counter() - start
    result["rss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux
    result["growth_kb"] = (status_kb("VmHWM") if own_peak else result["rss_kb"]) - started_kb
    kv.close()
    return result


def cleanup(url: str, tenant: str, campaign_id: str) -> None:
    """Drop the tenant's tables (a server Kv outlives the run)."""
    kv = setup_django(url)
    from botmesh_admin.kv import TenantKv

    TenantKv(kv, "crm").drop_tenant(tenant, ["contacts", "segments", "imports"])
    TenantKv(kv, "campaigns").drop_tenant(tenant, ["campaigns", f"d-{campaign_id}", "throttle"])
    kv.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contacts", type=int, default=100_000)
    parser.add_argument("--kv", help="a Kv URL every process can open (default: a temporary SQLite file)")
    parser.add_argument("--raw-setup", action="store_true", help="write the contacts without the CRM's index upkeep")
    parser.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)
    parser.add_argument("--ids", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:  # a child: one phase, figures as JSON on the last line
        tenant, segment_id, campaign_id = json.loads(args.ids)
        print(json.dumps(phase(args.phase, args.kv, tenant, segment_id, campaign_id)))
        return
    if args.kv and args.kv.startswith("memory:"):
        sys.exit("--kv: memory:// lives in one process; each phase runs in its own: use sqlite, postgresql or redis")
    folder = None if args.kv else tempfile.mkdtemp(prefix="campaign-plan-")
    url = args.kv or f"sqlite:///{folder}/kv.sqlite3"
    tenant = f"bench-{uuid.uuid4().hex[:8]}"
    campaign_id = "none"
    try:
        print(f"kv {url.split('://')[0]}  contacts {args.contacts:,}")
        segment_id, campaign_id = seed(url, tenant, args.contacts, raw=args.raw_setup)
        ids = json.dumps([tenant, segment_id, campaign_id])
        figures = {}
        for name in PHASES:
            out = subprocess.run(
                [sys.executable, __file__, "--phase", name, "--kv", url, "--ids", ids],
                cwd=ROOT,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            figures[name] = json.loads(out.strip().splitlines()[-1])
        held = max(1, figures["baseline"]["growth_kb"])
        print(f"{'phase':<10} {'peak RSS':>10} {'growth':>10} {'time':>9}  {'x baseline':>10}  result")
        for name in PHASES:
            f = figures[name]
            detail = {k: v for k, v in f.items() if k not in ("rss_kb", "growth_kb", "seconds")}
            print(
                f"{name:<10} {f['rss_kb'] / 1024:7.1f} MB {f['growth_kb'] / 1024:7.1f} MB {f['seconds']:8.2f}s  "
                f"{f['growth_kb'] / held:9.2f}x  {detail}"
            )
        print(
            f"baseline: {figures['baseline']['contacts']:,} contact ids held in a list grow the process by "
            f"{held / 1024:.1f} MB; the preview and the run plan should stay flat as --contacts grows"
        )
    finally:
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            cleanup(url, tenant, campaign_id)


if __name__ == "__main__":
    main()
