"""A PostgreSQL outage mid-ingest: JSON 503s, a worker that waits, nothing lost (issue 17, item 4).

The production layout over a PostgreSQL of the test's own (the Django
database, the Kv and the journal, as the README recommends): gunicorn serves
the webhooks and the API, ``manage.py botmesh_events_worker --channel inbound``
projects them into the inbox. Signed WhatsApp webhooks of two tenants are
sent — like Meta, a webhook not answered 200 is sent again later — and
PostgreSQL is stopped mid-ingest, then started again.

Regression: most answers during a stop were Django's HTML 500 page (the
channel-configuration lookup was not wrapped) and the worker exited with
status 1 on its first failed claim. Here every answer during the outage must
be the JSON 503 ``store_unavailable`` with ``Retry-After`` (tenant B was never
read before the stop, so its configuration comes from the stopped database),
the worker must still run, and once PostgreSQL is back every acknowledged
message is stored once and was processed by that worker.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from botmesh_admin.channels import whatsapp
from tests.polling import wait_until

from .servers import ROOT, Processes, fault_report, free_port, project_env, python

pytestmark = pytest.mark.slow

APP_SECRET = "fault-app-secret"
TENANTS = {"fault-a": "106540352242922", "fault-b": "106540352242923"}  # tenant -> phone number id
SETUP = """
import sys
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0, interactive=False)
from botmesh_admin.channels.services import channel_config_set
from botmesh_admin.tenancy.services import tenant_create
for tenant, number in {tenants!r}.items():
    tenant_create(tenant, name=tenant)
    channel_config_set(tenant, kind="whatsapp", name="main", phone_number_id=number, app_secret={secret!r})
call_command("botmesh_token", "create", "fault-a", "--name", "fault")
"""


def body(tenant: str, n: int) -> tuple[str, bytes]:
    """Return ``(wamid, raw body)`` of a one-text-message webhook for ``tenant``."""
    sender = "5730011100" + ("01" if tenant == "fault-a" else "02")
    wamid = f"wamid.fault.{tenant}.{n:04d}"
    data = {"object": "whatsapp_business_account", "entry": [{"id": "1", "changes": [{"field": "messages", "value": {
        "messaging_product": "whatsapp",
        "metadata": {"display_phone_number": "15550783881", "phone_number_id": TENANTS[tenant]},
        "contacts": [{"profile": {"name": "Cliente"}, "wa_id": sender}],
        "messages": [{"from": sender, "id": wamid, "timestamp": str(1_764_489_600 + n), "type": "text",
                      "text": {"body": f"mensaje {n}"}}]}}]}]}  # fmt: skip
    return wamid, json.dumps(data, separators=(",", ":")).encode()


class Answer:
    """One HTTP answer: status, content type, ``Retry-After`` and the JSON error code (if any)."""

    def __init__(self, status: int, content_type: str, retry_after: str | None, raw: bytes) -> None:
        self.status = status
        self.content_type = content_type
        self.retry_after = retry_after
        self.json: dict[str, object] = {}
        if content_type.startswith("application/json"):
            try:
                self.json = json.loads(raw)
            except ValueError:
                pass
        self.error = self.json.get("error")

    def is_store_unavailable(self) -> bool:
        return (self.status, self.error) == (503, "store_unavailable") and bool(self.retry_after)

    def __repr__(self) -> str:
        return f"<{self.status} {self.content_type} {self.error} Retry-After={self.retry_after}>"


def request(url: str, raw: bytes | None = None, headers: dict[str, str] | None = None) -> Answer:
    req = urllib.request.Request(url, data=raw, method="POST" if raw is not None else "GET", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=15) as response:
            return Answer(response.status, response.headers.get("Content-Type", ""), None, response.read())
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, exc.headers.get("Content-Type", ""), exc.headers.get("Retry-After"), exc.read())
    except OSError:  # not listening (yet)
        return Answer(0, "", None, b"")


def test_a_postgresql_outage_mid_ingest_answers_json_503_and_loses_nothing(tmp_path: Path) -> None:
    started = time.monotonic()
    with Processes(tmp_path) as procs:
        pg = procs.postgres()
        env = {**project_env(tmp_path), "DATABASE_URL": pg.url, "BOTMESH_KV_URL": pg.url,
               "BOTMESH_JOURNAL_URL": pg.url, "CELERY_BROKER_URL": "memory://"}  # fmt: skip
        setup = subprocess.run([python(), "-c", SETUP.format(tenants=TENANTS, secret=APP_SECRET)], cwd=ROOT,
                               env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert setup.returncode == 0, setup.stderr
        phases = {"setup": time.monotonic() - started}
        token = setup.stdout.strip().splitlines()[-1]
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        web = procs.start("web", [python(), "-m", "gunicorn", "botmesh_admin.wsgi", "-b", f"127.0.0.1:{port}",
                                  "-w", "1", "--threads", "4", "--log-level", "warning"], env)  # fmt: skip
        worker = procs.start("worker", [python(), "manage.py", "botmesh_events_worker", "--channel", "inbound",
                                        "--idle-ms", "100", "--max-backoff-ms", "1000"], env)  # fmt: skip
        acked: dict[str, str] = {}  # wamid -> tenant, answered 200
        answers: Counter[str] = Counter()
        outage_answers: list[Answer] = []

        def post(tenant: str, n: int) -> Answer:
            wamid, raw = body(tenant, n)
            answer = request(f"{base}/webhooks/whatsapp/{tenant}", raw, {
                "Content-Type": "application/json",
                whatsapp.SIGNATURE_HEADER: whatsapp.signature(raw, APP_SECRET),
            })  # fmt: skip
            answers["sent"] += 1
            answers[str(answer.status)] += 1
            if answer.status == 200:
                acked[wamid] = tenant
            return answer

        try:
            wait_until(lambda: web.poll() is None and request(f"{base}/healthz").status == 200, "gunicorn",
                       timeout_s=40)  # fmt: skip
            for n in range(10):  # tenant A only: its configuration is now in the web process's cache
                assert post("fault-a", n).status == 200
            wait_until(lambda: "events worker draining" in procs.log("worker"), "the events worker", timeout_s=30)
            phases["up"] = time.monotonic() - started

            pg.stop("fast")
            for n in range(10, 16):  # both tenants, and the API, while the database is stopped
                outage_answers += [post("fault-a", n), post("fault-b", n)]
                outage_answers.append(request(f"{base}/api/v1/tenants/fault-a/whoami",
                                              headers={"Authorization": f"Bearer {token}"}))  # fmt: skip
                time.sleep(0.2)
            ready = request(f"{base}/readyz")
            assert worker.poll() is None, f"the events worker exited ({worker.returncode}) during the outage"
            pg.start()
            phases["outage"] = time.monotonic() - started

            # Like Meta: everything not answered 200 is sent again until it is (bounded).
            pending = [(t, n) for n in range(10, 16) for t in TENANTS if body(t, n)[0] not in acked]
            pending += [(t, n) for n in range(16, 20) for t in TENANTS]
            deadline = time.monotonic() + 30
            while pending and time.monotonic() < deadline:
                pending = [(t, n) for t, n in pending if post(t, n).status != 200]
                time.sleep(0.2 if pending else 0)
            assert not pending, f"still refused after PostgreSQL came back: {pending}"
            phases["resent"] = time.monotonic() - started
            figures = _wait_stored(pg.url, acked, timeout_s=30)
            phases["stored"] = time.monotonic() - started
            assert worker.poll() is None, f"the events worker exited ({worker.returncode}) after the outage"
        except BaseException:
            print("worker:", procs.log("worker")[-4000:])
            print("web:", procs.log("web")[-4000:])
            raise
        worker_log = procs.log("worker")

    fault_report(
        f"FAULT postgres-outage: sent {answers['sent']}, answered 200 {answers['200']}, "
        f"503 {answers['503']}, other {answers['sent'] - answers['200'] - answers['503']}, "
        f"acknowledged {len(acked)}, stored {figures['stored']}, processed {figures['done']}, "
        f"duplicates {figures['duplicates']}, lost {figures['lost']}, {time.monotonic() - started:.1f} s "
        f"({', '.join(f'{k} at {v:.1f} s' for k, v in phases.items())})"
    )
    assert outage_answers and all(a.is_store_unavailable() for a in outage_answers), outage_answers
    assert ready.status == 503 and "database unreachable" in str(ready.json.get("reason")), ready.json
    assert answers["sent"] == answers["200"] + answers["503"], answers  # never an HTML 500
    assert len(acked) == 30  # tenant A: 20 webhooks, tenant B: 10
    assert (figures["stored"], figures["done"], figures["duplicates"], figures["lost"]) == (30, 30, 0, 0)
    assert worker_log.count("the store is back after") >= 1 and "Traceback" not in worker_log


def _wait_stored(url: str, acked: dict[str, str], timeout_s: float, *, kv_url: str | None = None) -> dict[str, int]:
    """Wait until the worker has processed every acknowledged webhook; return the figures.

    ``url`` is the journal's (and the Kv's, unless ``kv_url`` names another).
    """
    from botmesh_admin.events import connect_journal
    from botmesh_admin.kv import connect
    from inbox.stores.kv import KvInboxStore

    journal = connect_journal(url)
    kv = connect(kv_url or url)
    store = KvInboxStore(kv)
    try:

        def records() -> list:
            return [r for t in TENANTS for r in journal.list(tenant=t, limit=200)]

        wait_until(lambda: all(r.state == "done" for r in records()) and len(records()) == len(acked),
                   "the events worker to process every acknowledged webhook", timeout_s=timeout_s)  # fmt: skip
        stored = sum(store.message_by_provider_id(t, wamid) is not None for wamid, t in acked.items())
        in_conversations = sum(
            c.message_count for t in TENANTS for c in store.conversation_page(t, limit=50)[0]
        )  # fmt: skip
        return {"stored": stored, "done": len(records()), "duplicates": in_conversations - stored,
                "lost": len(acked) - stored}  # fmt: skip
    finally:
        journal.close()
        kv.close()
