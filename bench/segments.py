"""Segment evaluation over 100,000 contacts in the PostgreSQL Kv store.

Run ``.venv/bin/python bench/segments.py [--contacts 100000] [--rounds 3]``
after ``eval "$(scripts/services.sh)"``; it reads ``BOTMESH_TEST_POSTGRES_URL``.

Measured (best of ``--rounds``):

- **kv**: ``crm.selectors.segment_count`` over ``KvContactStore`` on PostgreSQL —
  the counters of the rules' terms, then the smallest posting list (here a tag,
  an attribute value or the reachable-on-WhatsApp list) walked 1000 ids at a
  time, its contacts fetched and the rules tested on them;
- **baseline**: a plain Python filter (a generator over the same contacts,
  already decoded in memory) with the same conditions written by hand.

The ratio is kv time / baseline time (how many times slower than an in-memory
filter). Setup writes the contacts through the store's batched writer
(``KvContactStore.contact_insert_batch``: records, identity claims and index
upkeep, 500 per commit; the services would take minutes).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "botmesh_admin.settings")

import django  # noqa: E402

django.setup()

from botmesh_admin.kv import TenantKv, connect  # noqa: E402
from crm import selectors  # noqa: E402
from crm.domain import Consent, Contact, Identity, new_id  # noqa: E402
from crm.stores import use_store  # noqa: E402
from crm.stores.kv import KvContactStore  # noqa: E402

TAGS = ["vip", "nuevo", "recurrente", "mayorista", "moroso"]
PLANS = ["basic", "pro", "enterprise", None]
RULES = {"tags_all": ["vip"], "attributes": {"plan": "pro"}, "consent_required": "whatsapp"}


def make_contacts(n: int, seed: int = 7) -> list[Contact]:
    """Return ``n`` synthetic contacts (deterministic)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        plan = rng.choice(PLANS)
        c = Contact(
            id=new_id("c"),
            identities=(Identity("whatsapp", f"+57300{i:07d}"),),
            name=f"Contact {i}",
            tags=tuple(sorted(rng.sample(TAGS, rng.randint(0, 3)))),
            attributes={"city": rng.choice(["Bogotá", "Cali", "CDMX"]), **({"plan": plan} if plan else {})},
            created_at=1,
            updated_at=1,
        )
        status = rng.choice(["granted", "denied", None])
        if status:
            c = c.with_consent(Consent("whatsapp", status, 1, "bench"))
        out.append(c)
    return out


def load(kv, tenant: str, contacts: list[Contact]) -> None:
    """Write ``contacts`` through the store's indexed write path, 500 per commit."""
    store = KvContactStore(kv)
    for start in range(0, len(contacts), 500):
        store.contact_insert_batch(tenant, contacts[start : start + 500])


def plain_filter(contacts: list[Contact]) -> int:
    """The baseline: the same rules as a hand-written generator over in-memory contacts."""
    return sum(
        1
        for c in contacts
        if "vip" in c.tags
        and type(c.attributes.get("plan")) is str
        and c.attributes.get("plan") == "pro"
        and c.consent.get("whatsapp") is not None
        and c.consent["whatsapp"].status == "granted"
        and any(i.channel == "whatsapp" for i in c.identities)
    )


def best(fn, rounds: int) -> tuple[float, int]:
    """Return (best seconds, result) of ``rounds`` calls."""
    times, result = [], 0
    for _ in range(rounds):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--contacts", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    url = os.environ.get("BOTMESH_TEST_POSTGRES_URL")
    if not url:
        sys.exit('set BOTMESH_TEST_POSTGRES_URL (eval "$(scripts/services.sh)")')
    kv = connect(url)
    tenant = f"bench-{uuid.uuid4().hex[:10]}"
    contacts = make_contacts(args.contacts)
    start = time.perf_counter()
    load(kv, tenant, contacts)
    print(f"setup: wrote {len(contacts)} contacts in {time.perf_counter() - start:.1f} s")
    try:
        with use_store(KvContactStore(kv)):
            kv_s, kv_count = best(lambda: selectors.segment_count(tenant, RULES), args.rounds)
        base_s, base_count = best(lambda: plain_filter(contacts), args.rounds)
        assert kv_count == base_count, (kv_count, base_count)
        n = len(contacts)
        print(f"segment {RULES}: {kv_count} of {n} contacts match")
        print(f"postgresql kv store : {kv_s * 1000:8.1f} ms  {n / kv_s:12,.0f} contacts/s")
        print(f"plain python filter : {base_s * 1000:8.1f} ms  {n / base_s:12,.0f} contacts/s")
        print(f"ratio (kv / baseline time): {kv_s / base_s:.1f}x")
    finally:
        TenantKv(kv, "crm").drop_tenant(tenant, ["contacts"])
        kv.close()


if __name__ == "__main__":
    main()
