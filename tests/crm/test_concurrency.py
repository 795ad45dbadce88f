"""Concurrent writers with real threads, over the memory store and the Kv store on every backend."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable

import pytest

from botmesh_admin.errors import Conflict
from botmesh_admin.kv import connect
from crm import selectors, services
from crm.domain import CHANNELS
from crm.stores.base import ContactStore
from crm.stores.kv import KvContactStore

from . import workers

THREADS = 8


def _run_together(work: Callable[[int], object], n: int = THREADS) -> list[object]:
    """Start ``n`` threads behind a barrier; return their results (re-raise the first error)."""
    barrier = threading.Barrier(n)
    results: list[object] = [None] * n
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = work(i)
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a writer hung"
    if errors:
        raise errors[0]
    return results


def test_concurrent_upserts_of_one_new_phone_leave_one_contact(crm: str, contact_store: ContactStore) -> None:
    writes = ["+573001112233", "57 300 111 2233", "573001112233", "300 111 2233"] * 2
    results = _run_together(
        lambda i: services.contact_upsert_identity(crm, channel="whatsapp", address=writes[i], source="inbox")
    )
    assert len({c.id for c in results}) == 1
    assert len(contact_store.contact_scan(crm, limit=100)) == 1


def test_concurrent_consent_and_tag_writes_are_all_kept(crm: str) -> None:
    contact = services.contact_create(
        crm,
        identities=[
            {"channel": "whatsapp", "address": "+573001112233"},
            {"channel": "telegram", "address": "700001004"},
            {"channel": "email", "address": "ana@example.com"},
        ],
    )
    final = {"whatsapp": "granted", "telegram": "denied", "email": "granted"}

    def work(i: int) -> None:
        if i < len(CHANNELS):
            channel = CHANNELS[i]
            for status in ("denied", "granted", final[channel]):
                services.consent_set(
                    crm, contact.id, channel=channel, status=status, source=f"writer-{i}", evidence=f"thread {i}"
                )
        else:
            for k in range(3):
                services.contact_tags_add(crm, contact.id, tags=[f"t{i}-{k}"])

    _run_together(work)
    after = selectors.contact_get(crm, contact.id)
    assert {ch: after.consent_status(ch) for ch in CHANNELS} == final
    assert set(after.tags) == {f"t{i}-{k}" for i in range(len(CHANNELS), THREADS) for k in range(3)}
    # every change is in the history; re-setting the current status is a no-op
    assert sorted((c.channel, c.status) for c in after.consent_history) == sorted(
        [
            ("whatsapp", "denied"),
            ("whatsapp", "granted"),
            ("telegram", "denied"),
            ("telegram", "granted"),
            ("telegram", "denied"),
            ("email", "denied"),
            ("email", "granted"),
        ]
    )


def test_concurrent_identity_claims_by_different_contacts_give_one_owner(crm: str) -> None:
    contacts = [
        services.contact_create(crm, identities=[{"channel": "telegram", "address": str(500 + i)}]) for i in range(4)
    ]

    def work(i: int) -> str:
        c = contacts[i % 4]
        try:
            services.contact_update(
                crm,
                c.id,
                expected_version=1,
                identities=[
                    *({"channel": x.channel, "address": x.address} for x in c.identities),
                    {"channel": "email", "address": "shared@example.com"},
                ],
            )
            return "won"
        except Conflict:
            return "lost"

    results = _run_together(work)
    owner = selectors.contact_find_by_identity(crm, channel="email", address="shared@example.com")
    assert results.count("won") == 1
    assert owner is not None and owner.addresses("email") == ["shared@example.com"]
    holders = [c for c in selectors.contact_iter(crm) if c.addresses("email")]
    assert [c.id for c in holders] == [owner.id]


@pytest.mark.services
def test_upserts_from_several_processes_leave_one_contact(postgres_url: str, redis_url: str, tenant_id: str) -> None:
    """Four processes (as four web/worker replicas) see the same new phone at once, on PostgreSQL and Redis."""
    addresses = ["+573001112233", "57 300 111 2233", "573001112233", "300 111 2233"]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(addresses))
    with ctx.Pool(len(addresses), initializer=workers.init, initargs=(barrier,)) as pool:
        for url in (postgres_url, redis_url):
            pending = [pool.apply_async(workers.upsert_in_process, (url, tenant_id, a)) for a in addresses]
            ids = [p.get(timeout=90) for p in pending]
            assert len(set(ids)) == 1
            store = KvContactStore(connect(url))
            try:
                assert [c.id for c in store.contact_scan(tenant_id)] == ids[:1]
            finally:
                store.kv.close()
