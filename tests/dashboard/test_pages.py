"""Replicas and jobs pages through Django's test client."""

from __future__ import annotations

import pytest

from botmesh_admin.coordination import selectors, services
from botmesh_admin.coordination.memory import MemoryCoordinator
from botmesh_admin.coordination.registry import declared_jobs

from .conftest import client_for

pytestmark = pytest.mark.usefixtures("members", "isolated")


def test_replicas_page_shows_replicas_leaders_turns_and_events(hub, web) -> None:  # type: ignore[no-untyped-def]
    """Every live replica with its incarnation, role and turns; leaders with fences; handovers."""
    worker = MemoryCoordinator(hub, "worker-7", lease_ms=5000, role="worker")
    worker.acquire_turn("whatsapp:+573001112233", 0)
    worker.acquire_turn("telegram:42", 0)
    first = web.try_lead("provider:wa-main")
    first.release()
    lead = worker.try_lead("provider:wa-main")
    worker._beat()
    html = client_for("bob").get("/t/tienda/replicas/").content.decode()
    assert 'data-replica="worker-7"' in html and worker.incarnation in html and web.incarnation in html
    row = html.split('data-replica="worker-7"')[1].split("</tr>")[0]
    assert "<td>worker</td>" in row and "<td>2</td>" in row and f"provider:wa-main #{lead.fence}" in row
    leaders = html.split('data-testid="leaders"')[1].split("</table>")[0]
    assert 'data-lead="provider:wa-main"' in leaders and f"<td>{lead.fence}</td>" in leaders
    events = html.split('data-testid="events"')[1].split("</table>")[0]
    assert "handover" in events and web.owner in events
    assert "573001112233" not in html  # chat ids never shown
    assert 'hx-trigger="every 2s"' in html and 'href="/t/tienda/replicas/"' in html
    worker.close()


def test_replicas_fragment_for_htmx_polling(web) -> None:  # type: ignore[no-untyped-def]
    response = client_for("bob").get("/t/tienda/replicas/", HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert response.status_code == 200 and "<html" not in html and 'id="replicas-live"' in html


def test_a_dead_replica_leaves_the_list(hub, web) -> None:  # type: ignore[no-untyped-def]
    gone = MemoryCoordinator(hub, "gone-1", lease_ms=5000, role="worker")
    assert "gone-1" in client_for("bob").get("/t/tienda/replicas/").content.decode()
    gone.close()
    assert "gone-1" not in client_for("bob").get("/t/tienda/replicas/").content.decode()


def test_the_embedded_scheduler_leader_is_shown(web) -> None:  # type: ignore[no-untyped-def]
    """Without Redis the file-locked beat publishes its leadership in the Kv."""
    services.scheduler_leader_publish("vm-4242", "abcd1234", 17)
    html = client_for("bob").get("/t/tienda/replicas/").content.decode()
    assert 'data-lead="scheduler"' in html and "<td>17</td>" in html and 'data-replica="vm-4242"' in html


def test_embedded_default_lists_the_worker_and_beat_of_other_processes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Without Redis the web, the Celery worker and the beat coordinate over the Kv (an SQLite file):
    each process's heartbeat, turns and leadership reach the page; a clean stop leaves it at once."""
    from botmesh_admin.coordination.kv import KvCoordinator
    from botmesh_admin.coordination.runtime import use_coordinator
    from botmesh_admin.kv import connect

    url = f"sqlite:///{tmp_path}/kv.sqlite3"

    def process(replica_id: str, role: str) -> KvCoordinator:  # one connection each, as separate processes
        return KvCoordinator(connect(url), "botmesh", 5000, replica_id, role=role, owns_kv=True)

    web, worker, beat = process("vm-web", "web"), process("vm-worker", "worker"), process("vm-beat", "beat")
    worker.acquire_turn("telegram:42", 0)
    lead = beat.try_lead("scheduler")
    assert lead is not None
    worker._beat()
    beat._beat()
    with use_coordinator(web):
        html = client_for("bob").get("/t/tienda/replicas/").content.decode()
        worker_row = html.split('data-replica="vm-worker"')[1].split("</tr>")[0]
        assert "<td>worker</td>" in worker_row and worker.incarnation in worker_row and "<td>1</td>" in worker_row
        beat_rows = html.split('data-replica="vm-beat"')
        assert len(beat_rows) == 2, "the beat is listed once, with its scheduler leadership"
        beat_row = beat_rows[1].split("</tr>")[0]
        assert "<td>beat</td>" in beat_row and f"scheduler #{lead.fence}" in beat_row
        assert 'data-replica="vm-web"' in html
        worker.close()  # a clean stop: gone at once (a killed one leaves after 3 × lease_ms)
        assert 'data-replica="vm-worker"' not in client_for("bob").get("/t/tienda/replicas/").content.decode()
    beat.close()
    web.close()


def test_jobs_page_is_for_admins_and_members_only(web) -> None:  # type: ignore[no-untyped-def]
    assert client_for("bob").get("/t/tienda/jobs/").status_code == 403
    assert 'href="/t/tienda/jobs/"' not in client_for("bob").get("/t/tienda/replicas/").content.decode()
    assert client_for("eve").get("/t/tienda/jobs/").status_code == 404
    assert client_for("eve").get("/t/tienda/replicas/").status_code == 404
    assert client_for("alice").get("/t/tienda/jobs/").status_code == 200


def test_jobs_page_shows_next_and_last_occurrences(hub, web) -> None:  # type: ignore[no-untyped-def]
    """kv.sweep: its schedule, next occurrence and the outcome of the last ones."""
    lease = web.try_lead("scheduler")
    spec = next(s for s in declared_jobs() if s.id == "kv.sweep")
    at = (services.now_ms() // 300_000) * 300_000
    services.scheduler_tick(specs=[spec], lease=lease, send=lambda *a: None, at_ms=at + 1000)
    assert services.jobs_drain("jobs-120s")["processed"] == 1
    html = client_for("alice").get("/t/tienda/jobs/").content.decode()
    row = html.split('data-job="kv.sweep"')[1].split("</tr>")[0]
    assert "every 5 min" in row and "latest (3600 s)" in row and 'pill ok">done' in row
    assert f"kv.sweep@{at}" in html
    assert 'data-job="events.drain.default"' in html  # plain beat entries are listed too


def test_jobs_page_shows_a_superseded_run_beside_the_outcome(hub, web) -> None:  # type: ignore[no-untyped-def]
    """Issue 17, item 2: a worker frozen past its lease resumed after another completed the occurrence.

    The page showed ``done, attempts 2`` with no sign of it; now the late run is shown superseded.
    """
    from botmesh_admin.coordination.occurrences import OccurrenceContext, Superseded
    from botmesh_admin.events import default_journal
    from tests.polling import wait_until

    lease = web.try_lead("scheduler")
    spec = next(s for s in declared_jobs() if s.id == "kv.sweep")
    at = (services.now_ms() // 300_000) * 300_000
    services.scheduler_tick(specs=[spec], lease=lease, send=lambda *a: None, at_ms=at + 1000)
    frozen = default_journal().claim(services.now_ms(), 100, "jobs-120s")  # then the worker froze
    assert frozen is not None
    wait_until(lambda: services.now_ms() > (frozen.leased_until or 0), "the frozen worker's lease to expire", 5)
    assert services.jobs_drain("jobs-120s")["processed"] == 1  # another worker completes it
    late = OccurrenceContext.from_record(frozen)
    late.worker = "vm-frozen-4242"
    with pytest.raises(Superseded):  # the frozen worker resumes: refused before its next effect
        late.check()
    html = client_for("alice").get("/t/tienda/jobs/").content.decode()
    row = html.split('data-job="kv.sweep"')[1].split("</tr>")[0]
    assert 'pill ok">done' in row and "2 attempts" in row
    assert 'data-testid="superseded"' in row and "run on vm-frozen-4242" in row
    recent = html.split('data-testid="occurrences"')[1].split("</table>")[0].split(f"kv.sweep@{at}")[1]
    line = recent.split("</tr>")[0]
    assert 'data-testid="superseded-run"' in line and "attempt 1 on <code>vm-frozen-4242</code>" in line
    assert f"(fencing token {frozen.fencing_token})" in line and "taken over by fencing token" in line


def test_a_superuser_edits_a_job(web) -> None:  # type: ignore[no-untyped-def]
    alice = client_for("root")  # jobs run for every tenant: only the installation's operator changes them
    form = {
        "kind": "interval",
        "every_s": "120",
        "crontab": "",
        "enabled": "on",
        "catch_up": "all",
        "catch_up_window_s": "600",
        "version": "0",
    }
    response = alice.post("/t/tienda/jobs/kv.sweep/", form)
    assert response.status_code == 302
    row = selectors.job_get("kv.sweep")
    assert row.job.settings.schedule.every_s == 120 and row.job.settings.catch_up == "all"
    assert row.job.settings.updated_by == "user:root" and row.job.version == 1
    assert "Job kv.sweep saved." in alice.get("/t/tienda/jobs/").content.decode()
    # the same form again carries version 0: somebody else saved meanwhile
    stale = alice.post("/t/tienda/jobs/kv.sweep/", form)
    assert stale.status_code == 409
    cron = {**form, "kind": "crontab", "every_s": "", "crontab": "0 3 * * *", "version": "1", "enabled": ""}
    assert alice.post("/t/tienda/jobs/kv.sweep/", cron).status_code == 302
    row = selectors.job_get("kv.sweep")
    assert row.job.settings.schedule.crontab == "0 3 * * *" and not row.job.settings.enabled and row.next_ms is None
    # the form's address opened as a page: the 405 page in words, as every form's (README)
    opened = alice.get("/t/tienda/jobs/kv.sweep/")
    assert opened.status_code == 405 and opened["Allow"] == "POST"
    assert "not a page." in opened.content.decode() and "open the page the button is on" in opened.content.decode()


def test_a_bad_schedule_is_shown_with_its_field(web) -> None:  # type: ignore[no-untyped-def]
    form = {
        "kind": "crontab",
        "every_s": "",
        "crontab": "99 * * * *",
        "enabled": "on",
        "catch_up": "skip",
        "catch_up_window_s": "0",
        "version": "0",
    }
    response = client_for("root").post("/t/tienda/jobs/kv.sweep/", form)
    html = response.content.decode()
    assert response.status_code == 422 and "schedule.crontab" not in html  # plain words, not the domain path
    form_html = html[html.index('id="edit-kv.sweep"') :]
    # what was typed is still in the form, and the error sits under the crontab input
    assert 'name="crontab" placeholder="m h dom mon dow" value="99 * * * *" aria-invalid="true"' in form_html
    assert (
        '<p class="field-error" id="kv.sweep-crontab-error" role="alert" data-testid="field-error">Not a valid crontab'
        in form_html
    )
    assert selectors.job_get("kv.sweep").job.version == 0


def test_unknown_job_and_agents_cannot_edit(web) -> None:  # type: ignore[no-untyped-def]
    form = {
        "kind": "interval",
        "every_s": "60",
        "enabled": "on",
        "catch_up": "skip",
        "catch_up_window_s": "0",
        "version": "0",
    }
    assert client_for("root").post("/t/tienda/jobs/nope/", form).status_code == 404
    assert client_for("alice").post("/t/tienda/jobs/nope/", form).status_code == 404
    assert client_for("bob").post("/t/tienda/jobs/kv.sweep/", form).status_code == 403
    assert selectors.job_get("kv.sweep").job.version == 0


def test_a_tenants_admin_sees_the_jobs_but_cannot_change_what_every_tenant_runs(web) -> None:  # type: ignore[no-untyped-def]
    """A fresh user's report: eve, admin of another tenant only, set every tenant's campaigns.tick to 13 s."""
    form = {"kind": "interval", "every_s": "13", "enabled": "on", "catch_up": "latest", "catch_up_window_s": "600"}
    refused = client_for("eve").post("/t/otra/jobs/kv.sweep/", {**form, "version": "0"})
    assert refused.status_code == 403
    assert "only a superuser changes them" in refused.content.decode()
    assert selectors.job_get("kv.sweep").job.version == 0
    page = client_for("eve").get("/t/otra/jobs/").content.decode()
    assert 'data-job="kv.sweep"' in page and 'data-testid="jobs-read-only"' in page
    assert 'id="edit-kv.sweep"' not in page and "/jobs/kv.sweep/" not in page
