"""Process entry points for the multi-process CRM tests (spawned, so each has its own connections)."""

from __future__ import annotations

import os
from typing import Any

_barrier: Any = None


def init(barrier: Any) -> None:
    """Pool initializer: set Django up once per process and keep the start barrier."""
    global _barrier
    _barrier = barrier
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "botmesh_admin.settings")
    import django

    django.setup()


def upsert_in_process(kv_url: str, tenant: str, address: str) -> str:
    """Connect, wait until every process is ready, upsert one WhatsApp identity; return the contact id."""
    from botmesh_admin.kv import connect
    from crm import selectors, services
    from crm.stores import use_store
    from crm.stores.kv import KvContactStore

    selectors._regions[tenant] = ("CO", float("inf"))
    kv = connect(kv_url)
    try:
        with use_store(KvContactStore(kv)):
            kv.get("crm/warm-up/x", "x")  # connect before the start line
            _barrier.wait(timeout=30)
            return services.contact_upsert_identity(tenant, channel="whatsapp", address=address, source="inbox").id
    finally:
        kv.close()


def import_worker(kv_url: str, journal_url: str, tenant: str, lease_ms: int) -> None:
    """A journal worker of the ``crm-import`` channel over ``kv_url`` and ``journal_url``, until killed."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "botmesh_admin.settings")
    import django

    django.setup()
    from botmesh_admin.events import connect_journal, use_journal
    from botmesh_admin.events.handlers import dispatch
    from botmesh_admin.events.worker import EventWorker
    from botmesh_admin.kv import connect
    from crm import selectors
    from crm.services.imports import IMPORT_CHANNEL
    from crm.stores import use_store
    from crm.stores.kv import KvContactStore

    selectors._regions[tenant] = ("CO", float("inf"))  # this process has no migrated database
    kv, journal = connect(kv_url), connect_journal(journal_url)
    with use_store(KvContactStore(kv)), use_journal(journal):
        EventWorker(journal, lease_ms=lease_ms, channel=IMPORT_CHANNEL, max_backoff_ms=200).run_forever(
            dispatch, idle_ms=20
        )
