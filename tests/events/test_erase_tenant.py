"""``TenantErasure.erase_tenant`` on every journal backend (issue 15, item 9: tenant erasure).

Every record of the tenant goes, whatever its state, with its idempotency keys
and counts; another tenant's records are untouched; a batch at a time, so a
killed erasure resumes.
"""

from __future__ import annotations

import pytest

from botmesh_admin.errors import ValidationError
from botmesh_admin.events import EventJournal
from botmesh_admin.events.base import TenantErasure

from .conftest import FakeClock
from .test_conformance import LEASE, env


def test_erase_tenant_forgets_every_record_of_the_tenant_only(journal: EventJournal, clock: FakeClock) -> None:
    assert isinstance(journal, TenantErasure)
    for n in range(7):
        journal.append(env(f"a{n}", tenant="acme", channel="ch-1" if n % 2 else None))
        journal.append(env(f"b{n}", tenant="globex"))
    done = journal.claim(clock(), LEASE)  # one of each state: done, leased, dead, pending
    assert done is not None
    journal.ack(done.id, clock(), done.fencing_token)
    journal.claim(clock(), LEASE, channel="ch-1")
    before = {r.id: r for r in journal.list(tenant="globex", limit=200)}

    assert journal.erase_tenant("acme", limit=3) == 3  # a batch at a time
    assert journal.erase_tenant("acme", limit=1000) == 4
    assert journal.erase_tenant("acme") == 0  # idempotent
    assert journal.list(tenant="acme", limit=200) == []
    assert journal.counts("acme") == {}
    assert {r.id: r for r in journal.list(tenant="globex", limit=200)} == before
    assert sum(journal.counts("globex").values()) == 7
    again = journal.append(env("a1", tenant="acme"))  # the idempotency key is free again
    assert again.state == "pending" and journal.get(again.id) is not None


@pytest.mark.parametrize("bad", [{"tenant": "Not An Id"}, {"tenant": "acme", "limit": 0}])
def test_erase_tenant_refuses_bad_arguments(journal: EventJournal, bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        journal.erase_tenant(**bad)  # type: ignore[attr-defined]
