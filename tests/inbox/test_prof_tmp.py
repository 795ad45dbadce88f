import os, cProfile, pstats, pytest
from botmesh_admin.kv import connect
from inbox.services import Inbox
from inbox.stores.kv import KvInboxStore
from tests.inbox.conftest import ledger_records

@pytest.mark.django_db
def test_prof():
    inbox = Inbox(KvInboxStore(connect(os.environ["BOTMESH_TEST_POSTGRES_URL"])))
    recs = [dict(r, tenantId=None) for r in ledger_records()[:200]]
    pr = cProfile.Profile(); pr.enable()
    for r in recs: inbox.project_message(r, tenant="tprof2")
    pr.disable()
    pstats.Stats(pr).sort_stats("cumulative").print_stats(25)
