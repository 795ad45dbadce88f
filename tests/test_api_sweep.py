"""Every API operation, read from the mounted routers, keeps tenants apart and enforces its role (issue 18, item 5).

NetBox's generic API test mixins are the model: no list of endpoints here. The
sweep walks ``api``'s bound routers, fills each path with tenant A's real ids
(a seeded tenant with a conversation, note, contact, segment, import, campaign,
channel, plugin, bot version, gate run, event and token), and calls it:

- with tenant B's admin token on A's path: 404, the error shape only, none of
  A's marked text, and A's Kv tables, journal and tokens unchanged;
- again on B's own path with A's ids: never one of A's records, A unchanged;
- with A's agent and bot tokens: 403 wherever the role the operation declares
  (``@requires``) does not admit them, not 403 where it does; nothing written.

A new endpoint is swept without anyone adding it here; one that declares no
role fails ``test_every_operation_declares_its_role``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.test import Client

from botmesh_admin.api import api, declared_role
from botmesh_admin.demo import fixtures_dir
from tests.backends import unique_id

MARKER = "zq-tenant-a-secret"
# Who may call an operation that declares each role (ARCHITECTURE §11; README "Roles"), written out
# here rather than read from the code under test.
ADMITS = {"admin": {"admin"}, "agent": {"agent", "admin"}, "bot": {"bot", "admin"}, "member": {"admin", "agent", "bot"}}
ERROR_KEYS = {"error", "message", "field", "errors"}


@dataclass(frozen=True)
class Op:
    method: str
    path: str  # /api/v1/tenants/{tenant}/…
    role: str | None
    name: str


def operations() -> list[Op]:
    """Every operation the API serves, from its bound routers."""
    found = []
    for bound in api._get_bound_routers():
        for path, path_view in bound.path_operations.items():
            full = "/api/v1/" + re.sub(r"\{\w+:(\w+)\}", r"{\1}", bound.prefix + path).strip("/")
            for operation in path_view.operations:
                for method in operation.methods:
                    name = f"{operation.view_func.__module__}.{operation.view_func.__name__}"
                    found.append(Op(method, full, declared_role(operation.view_func), name))
    return found


@dataclass
class Tenants:
    a: str
    b: str
    tokens: dict[str, str]  # admin, agent, bot of A; b_admin of B
    ids: dict[str, str] = field(default_factory=dict)

    def call(self, op: Op, token: str, *, tenant: str | None = None) -> Any:
        path = op.path.replace("{tenant}", tenant or self.a)
        path = re.sub(r"\{(\w+)\}", lambda m: self.ids.get(m.group(1), "x1"), path)
        kwargs: dict[str, Any] = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
        if op.method in ("POST", "PUT", "PATCH"):
            kwargs.update(data=b"{}", content_type="application/json")
        return getattr(Client(), op.method.lower())(path, **kwargs)


def _text(response: Any) -> str:
    raw = b"".join(response.streaming_content) if response.streaming else response.content
    return raw.decode(errors="replace")


def _diff(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Name what changed between two snapshots (tables, journal, tokens)."""
    changed = [t for t in set(before["tables"]) | set(after["tables"])
               if before["tables"].get(t) != after["tables"].get(t)]  # fmt: skip
    return changed + [part for part in ("events", "tokens") if before[part] != after[part]]


def _ok(response: Any, what: str) -> Any:
    assert response.status_code < 300, (what, response.status_code, response.content[:300])
    return response.json() if response.content else None


@pytest.fixture
def tenants(db) -> Iterator[Tenants]:
    """Tenant A with one of everything (marked with ``MARKER``), tenant B empty; tokens of every role."""
    yield seed_tenant("sweep")


def seed_tenant(prefix: str) -> Tenants:
    """Create tenant A (``<prefix>-a-…``) with one of everything through the API, and an empty tenant B.

    Used by the schemathesis test too, so that its run has ids to follow.
    """
    from botmesh_admin.events.services import journal_drain
    from botmesh_admin.tenancy import services as tenancy

    a, b = unique_id(f"{prefix}-a"), unique_id(f"{prefix}-b")
    tenancy.tenant_create(a, name="A")
    tenancy.tenant_create(b, name="B")
    t = Tenants(a, b, {role: tenancy.token_create(a, name=f"{role}-token", role=role)[1]
                       for role in ("admin", "agent", "bot")})  # fmt: skip
    t.tokens["b_admin"] = tenancy.token_create(b, name="b-admin", role="admin")[1]
    client = Client(HTTP_AUTHORIZATION=f"Bearer {t.tokens['admin']}")
    base = f"/api/v1/tenants/{a}/"

    def post(path: str, body: Any, method: str = "post") -> Any:
        return _ok(getattr(client, method)(base + path, json.dumps(body), content_type="application/json"), path)

    records = [json.loads(line) for line in (fixtures_dir() / "ledger" / "messages.jsonl").read_text().splitlines()
               if line.strip()][:200]  # fmt: skip
    mine = [dict(r, tenantId=None) for r in records if r["tenantId"] == "soporte"][:12]
    _ok(client.post(base + "ledger", "\n".join(json.dumps(r) for r in mine), content_type="application/x-ndjson"),
        "ledger")  # fmt: skip
    while sum(journal_drain(channel="ledger", limit=500).values()):
        pass
    conversation = _ok(client.get(base + "conversations"), "conversations")["items"][0]
    t.ids.update(conversation_id=conversation["id"], chat_id=mine[0]["chatId"])
    t.ids["message_id"] = _ok(client.get(base + f"conversations/{conversation['id']}/messages"), "m")["items"][0]["id"]
    post(f"conversations/{conversation['id']}/notes", {"text": f"note {MARKER}"})
    t.ids["contact_id"] = post(
        "contacts",
        {"name": f"Ana {MARKER}", "identities": [{"channel": "telegram", "address": "424242"}], "tags": ["vip"]},
    )["id"]
    t.ids["segment_id"] = post("segments", {"name": f"seg {MARKER}", "rules": {"tags_all": ["vip"]}})["id"]
    imported = client.post(base + "contacts/imports", b"name,email\nBo,bo@example.com\n", content_type="text/csv")
    t.ids["job_id"] = _ok(imported, "import")["id"]
    post("channels/tg", {"kind": "telegram", "bot_username": "sweep_bot", "webhook_secret": "w" * 32,
                         "bot_token": "600000000:AAF-fixture-bot-token-not-real-xyz"}, method="put")  # fmt: skip
    t.ids["name"] = "tg"
    t.ids["campaign_id"] = post("campaigns", {"name": f"camp {MARKER}", "segment_id": t.ids["segment_id"],
                                              "channel": "telegram", "channel_name": "tg",
                                              "message": {"text": "hi"}})["id"]  # fmt: skip
    manifest = (fixtures_dir() / "hub" / "valid" / "order-status.json").read_bytes()
    t.ids["plugin_id"] = _ok(client.post(base + "plugins", manifest, content_type="application/json"),
                             "plugin")["plugin_id"]  # fmt: skip
    spec = json.loads((fixtures_dir() / "deployments" / "version_1.json").read_text())
    version = post(f"bots/{spec['bot']}/versions", spec)
    t.ids.update(bot=spec["bot"], version=version["version"], gate=spec["gates"][0])
    t.ids["run_id"] = post(f"bots/{spec['bot']}/versions/{version['version']}/gates/{spec['gates'][0]}/runs",
                           {})["run_id"]  # fmt: skip
    t.ids["event_id"] = _ok(client.get(base + "events"), "events")["items"][0]["id"]
    t.ids["token_id"] = str(_ok(client.get(base + "tokens"), "tokens")[0]["id"])
    t.ids["trace_id"] = "0" * 32
    return t


def snapshot(tenant: str) -> dict[str, Any]:
    """Everything of ``tenant`` that an API call could write: its Kv tables, journal records and tokens."""
    from botmesh_admin.events.selectors import event_list
    from botmesh_admin.kv.runtime import default_kv
    from botmesh_admin.tenancy.models import ApiToken

    kv = default_kv()
    tables: dict[str, Any] = {}
    for table in kv.tables():
        # Every request is traced in its tenant (also a refused one): that is observability, not a write.
        if table.split("/")[1:2] != [tenant] or table.startswith("observability/"):
            continue
        rows, after = [], None
        while page := kv.scan(table, after=after, limit=500):
            rows.extend((e.key, e.version, json.dumps(e.value, sort_keys=True)) for e in page)
            after = page[-1].key
        tables[table] = rows
    events, _ = event_list(tenant, limit=200)
    tokens = sorted(ApiToken.objects.filter(tenant_id=tenant).values_list("id", "revoked_at"))
    return {"tables": tables, "events": [(e.id, e.state, e.attempts) for e in events], "tokens": tokens}


def test_every_operation_declares_its_role() -> None:
    ops = operations()
    assert len(ops) >= 60, len(ops)
    assert not [op.name for op in ops if op.role is None], "declare a role with @requires(...)"


def test_tenant_b_never_reaches_tenant_a(tenants: Tenants) -> None:
    before = snapshot(tenants.a)
    assert before["tables"] and before["events"], "tenant A was seeded"
    failures = []
    for op in operations():
        response = tenants.call(op, tenants.tokens["b_admin"])
        body = response.content.decode(errors="replace")
        if response.status_code != 404 or set(response.json()) - ERROR_KEYS or MARKER in body:
            failures.append((op.method, op.path, response.status_code, body[:200]))
        # A's ids on B's own path: never one of A's records, nothing of A changed (checked below)
        mine = tenants.call(op, tenants.tokens["b_admin"], tenant=tenants.b)
        text = _text(mine)
        if mine.status_code == 500 or MARKER in text:
            failures.append((op.method, op.path.replace("{tenant}", "<B>"), mine.status_code, text[:200]))
        if op.method == "GET":
            # B's own traces name the paths B asked for (A's ids among them): only A's records count.
            leaked = (
                []
                if "/traces" in op.path
                else [
                    name
                    for name, value in tenants.ids.items()
                    if name not in ("trace_id", "name", "bot", "gate", "version", "chat_id", "token_id")
                    and value in text
                ]
            )
            if mine.status_code == 200 and leaked:
                failures.append((op.method, op.path.replace("{tenant}", "<B>"), mine.status_code, text[:200]))
    assert not failures, failures
    assert not _diff(before, snapshot(tenants.a)), "a call with tenant B's token changed tenant A"


@pytest.mark.parametrize("role", ["agent", "bot"])
def test_each_role_gets_403_where_the_operation_does_not_admit_it(tenants: Tenants, role: str) -> None:
    before = snapshot(tenants.a)
    failures, refused = [], 0
    for op in operations():
        admitted = role in ADMITS[op.role or "admin"]
        if admitted and op.method != "GET":
            continue  # an admitted write would write; the role check is what is swept
        response = tenants.call(op, tenants.tokens[role])
        if not admitted:
            refused += 1
            if response.status_code != 403 or response.json()["error"] != "permission_denied":
                failures.append((op.method, op.path, op.role, response.status_code, response.content[:200]))
        elif response.status_code == 403:
            failures.append((op.method, op.path, op.role, 403, response.content[:200]))
    assert not failures, failures
    assert refused >= (15 if role == "agent" else 50)
    assert not _diff(before, snapshot(tenants.a)), f"a {role} token changed tenant A where it was refused"
