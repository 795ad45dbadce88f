"""Scale: every page read at 10⁴, 10⁵ and 10⁶ conversations and contacts per tenant, beside a Django peer.

Run ``.venv/bin/python bench/scale.py [--sizes 10000,100000,1000000] [--kv URL]``
after ``eval "$(scripts/services.sh)"`` (reads ``BOTMESH_TEST_POSTGRES_URL``).
``--tenant T --keep`` keeps the tenant and its peer tables, and a later run
with the same ``--tenant`` resumes or grows it instead of building again (the
1,000,000 build takes a while); ``--drop T`` removes a kept tenant.

Where: the bench database ``botmesh_bench_scale`` on the PostgreSQL server of
``BOTMESH_TEST_POSTGRES_URL`` (created if missing) holds the Django tables, the
peer schema and the build's progress; the Kv is that database too unless
``--kv`` names another (``--kv redis://127.0.0.1:6379/9``, or the test database
itself). The tenant is ``scale-<random>`` unless ``--tenant`` is given; its Kv
tables, peer tables and Django row are dropped at the end unless ``--keep``.

The tenant (deterministic from its index ``i``; the same rows on both sides):

- contacts ``i``: WhatsApp (3 in 4) or Telegram identity, an email for 1 in 3,
  accented names (50 named Zoraida), tags (vip 5 %, nuevo 30 %,
  recurrente 20 %, mayorista 2 %, embajador 25 contacts), attributes city /
  plan / score, marketing consent per channel. The rare name and the rare
  tag belong to a fixed set among the first 10,000 contacts (the oldest), so
  their reads return the same rows at every size (a page of 50, and 25) and
  their growth is the index's, not a longer answer's: at 1,000,000 they are
  1 in 20,000 and 1 in 40,000, deep under every newer contact;
- conversations ``i`` (the contact's chat): 1–3 messages, status open 50 % /
  pending 15 % / resolved 35 %, assignee ana 30 % / ben 20 % / none, newest
  activity for the highest ``i``; read markers of ana (35 %) and ben (20 %);
- five saved segments and one campaign to the WhatsApp opt-ins, planned and
  paused, with a delivery for every 4th contact (accepted 70 %, failed,
  dropped, pending, cancelled, in doubt).

Ours is written **through the stores' own write path** — ``contact_insert``,
``write(Change)`` of the inbox store, ``read_marker_set``, ``slots_add`` — so
every index a store maintains is maintained, by ``--jobs`` processes whose Kv
(``WriteBackKv``) merges consecutive store commits into one Kv commit of about
800 operations (the content is exactly what one commit per write leaves; a read
of an unflushed key flushes first). Chunks of 2,000 items stream, so memory
stays bounded. The peer is a plain PostgreSQL schema loaded with ``COPY``:
conversations (tenant, assignee, status, channel, last_activity_ms,
inbound_count; B-tree indexes per list order), per-agent read markers
(``read_inbound``), contacts (``tags text[]`` + GIN, ``attributes jsonb`` + GIN
``jsonb_path_ops``, consent per channel, folded name / phone / email with
``text_pattern_ops``) and deliveries (campaign, state, recipient). Its reads run
through the Django ORM (unmanaged models over those tables) and as raw SQL
through psycopg, and every read's answer is compared with ours.

After each build up to ``--check-max`` items, ``botmesh_check_indexes`` compares
every index of the tenant with its records (zero drift, or the run stops).

Reads, each with the same question asked of the peer: ``conversation_list`` for
all / mine / unassigned × (any, status open, channel telegram), first page and
the page after 20 cursors, unread-only and a narrow view × status × channel;
``unread_total``; the list counts per view and status; ``contact_list`` first
page, by tag (common, rare), consent, attribute, and search (name prefix,
phone, email); total contacts; ``segment_count`` (one rule, three rules),
``segment_preview``, ``segment_counts``; ``campaign_progress``; ``delivery_list``
by state and by state + reason. A selector that does not exist yet (counts,
consent and attribute filters before the indexes) is replaced by what a page
could do without it, and the row says so. Then whole admin pages (``GET`` by a
member through Django's test client; ``--no-pages`` skips them), without a peer.

Each read prints ours (median of ``--reps`` calls after one warm-up, at most
``--budget`` seconds per read; the best of ``--rounds`` passes over the whole
list, so a burst of load from the machine's other users costs a read one pass,
not its figure), the ORM and raw SQL, the ratios, what ours
asked of the Kv per call (gets, scans, get_many keys, entries read) and whether
the answers agree (a CRM page may stop short within its read budget and return
a cursor: "short page", its rows the first of the peer's). Targets at the
largest size: growth from the smallest size ≤ 1.5×, ours ≤ 3× the ORM, ours ≤
150 ms. The closing Markdown table is saved to ``bench/results/`` (and to
every ``--copy-to`` directory) as ``scale_<kv>_<sizes>.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import multiprocessing
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
import unicodedata
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DATABASE = "botmesh_bench_scale"
CHUNK = 2000
STEP_MS = 1000  # conversation i's first message is at base + i s: the highest i is the newest
PAGE = 50
DEEP_PAGES = 20  # a deep page is the 21st, reached through the cursors of the 20 before
AGENT = "ana"
TARGET_GROWTH = 1.5
TARGET_ORM = 3.0
TARGET_MS = 150.0
PACKAGES = ("inbox", "crm", "campaigns")
PHASES = ("contacts", "conversations", "markers", "deliveries")
CHANNEL_NAMES = {"whatsapp": "main", "telegram": "bot"}

FIRST = (
    "José",
    "María",
    "Ana",
    "Luis",
    "Sofía",
    "Andrés",
    "Camila",
    "Jesús",
    "Valentina",
    "Óscar",
    "Lucía",
    "Martín",
    "Daniela",
    "Tomás",
    "Isabel",
    "Nicolás",
)
LAST = (
    "Pérez",
    "Gómez",
    "Rodríguez",
    "Núñez",
    "Martínez",
    "López",
    "García",
    "Hernández",
    "Díaz",
    "Muñoz",
    "Álvarez",
    "Castro",
    "Ríos",
    "Ortiz",
    "Vargas",
    "Jiménez",
)
RARE_FIRST = "Zoraida"
CITIES = (
    "Bogotá",
    "Medellín",
    "Cali",
    "Barranquilla",
    "Cartagena",
    "Bucaramanga",
    "Pereira",
    "Manizales",
)
DOMAINS = ("correo.co", "example.com", "mail.com.co")
TAGS = {
    "vip": (20, 5, 100),
    "nuevo": (21, 30, 100),
    "recurrente": (22, 20, 100),
    "mayorista": (23, 2, 100),
}  # tag: (salt, share, out of)
RARE_TAG = "embajador"
RARE_TAG_EVERY, RARE_NAME_EVERY, RARE_AMONG = 400, 200, 10_000
"""``RARE_TAG`` for every 400th, ``RARE_FIRST`` for every 200th of the first 10,000 contacts (25 and 50)."""
SEGMENTS: dict[str, dict[str, Any]] = {
    "vip": {"tags_all": ["vip"]},
    "vip-pro-whatsapp": {
        "tags_all": ["vip"],
        "attributes": {"plan": "pro"},
        "consent_required": "whatsapp",
    },
    "whatsapp-optin": {"consent_required": "whatsapp"},
    "medellin": {"attributes": {"city": "Medellín"}},
    "wholesale": {"tags_any": ["mayorista", "embajador"]},
}
DELIVERY_STATES = (
    (70, "accepted", None),
    (78, "failed", "code:131026"),
    (85, "dropped", "opted_out"),
    (95, "pending", None),
    (98, "cancelled", "campaign_cancelled"),
    (100, "in_doubt", "no_answer"),
)


# -- environment --------------------------------------------------------------------------


def database_url(server_url: str, name: str) -> str:
    parts = urlsplit(server_url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


def ensure_database(server_url: str) -> str:
    """Create the bench database if missing (never dropped: kept tenants live there); return its URL."""
    import psycopg

    with psycopg.connect(server_url, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone() is None:
            conn.execute(f'CREATE DATABASE "{DATABASE}"')
    return database_url(server_url, DATABASE)


def bench_env(db_url: str, kv_url: str) -> dict[str, str]:
    """Return the environment of this process and the builders: the bench database, the Kv under test."""
    return {
        "DJANGO_SETTINGS_MODULE": "botmesh_admin.settings",
        "DATABASE_URL": db_url,
        "BOTMESH_KV_URL": kv_url,
        "BOTMESH_JOURNAL_URL": db_url,
        "CELERY_BROKER_URL": "memory://",
        "DEBUG": "0",
        "BOTMESH_DATA_DIR": os.environ.get("BOTMESH_BENCH_DIR") or tempfile.mkdtemp(prefix="bench-scale-"),
        "BOTMESH_BENCH_DB": db_url,
        "ALLOWED_HOSTS": "testserver,localhost",
    }


def django_setup(env: dict[str, str]) -> None:
    os.environ.update(env)
    os.environ["BOTMESH_BENCH_DIR"] = env["BOTMESH_DATA_DIR"]
    import django

    django.setup()
    logging.disable(logging.WARNING)  # one INFO line per created contact would dominate the build


# -- the tenant: every record is a function of its index i ----------------------------------

MASK = 2**64 - 1


def mix(i: int, salt: int) -> int:
    """Return a well-mixed 64-bit integer of ``(i, salt)`` (splitmix64): the tenant's dice."""
    z = (i * 0x9E3779B97F4A7C15 + salt * 0xD1B54A32D192ED03) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


@dataclass(frozen=True)
class Spec:
    """What every builder and read needs to know of the tenant."""

    tenant: str
    base_ms: int
    campaign_id: str = ""
    segments: dict[str, str] = field(default_factory=dict)  # SEGMENTS name → segment id

    @property
    def prefix(self) -> str:
        """The peer tables' name prefix (``scale_<tenant>_``)."""
        return "scale_" + self.tenant.replace("-", "_") + "_"


def channel_of(i: int) -> str:
    return "telegram" if i % 4 == 3 else "whatsapp"


def phone_of(i: int) -> str:
    return f"+57300{i:07d}"


def telegram_of(i: int) -> str:
    return str(7_000_000_000 + i)


def email_of(i: int) -> str | None:
    return f"user{i}@{DOMAINS[mix(i, 11) % len(DOMAINS)]}" if mix(i, 10) % 3 == 0 else None


def name_of(i: int) -> str:
    rare = i < RARE_AMONG and i % RARE_NAME_EVERY == 13
    first = RARE_FIRST if rare else FIRST[mix(i, 7) % len(FIRST)]
    return f"{first} {LAST[mix(i, 8) % len(LAST)]}"


def fold(text: str) -> str:
    """Case- and accent-fold like the CRM's search (``crm.selectors._fold``)."""
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def contact_id_of(spec: Spec, i: int) -> str:
    # ``new_id("c")``'s shape: 12 hex of ms, 4 of sequence, 6 random; ids sort by i.
    return f"c_{spec.base_ms + i:012x}0000{mix(i, 6) & 0xFFFFFF:06x}"


def conversation_id_of(i: int) -> str:
    return f"cv_{i:010x}{mix(i, 1) & 0xFFFFFFFFFF:010x}"


def tags_of(i: int) -> list[str]:
    tags = [tag for tag, (salt, share, out_of) in TAGS.items() if mix(i, salt) % out_of < share]
    if i < RARE_AMONG and i % RARE_TAG_EVERY == 7:
        tags.append(RARE_TAG)
    return sorted(tags)


def attributes_of(i: int) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "city": CITIES[mix(i, 30) % len(CITIES)],
        "score": mix(i, 31) % 100,
    }
    roll = mix(i, 32) % 100
    plan = "basic" if roll < 50 else "pro" if roll < 80 else "enterprise" if roll < 81 else None
    if plan:
        attributes["plan"] = plan
    return attributes


def consent_of(i: int) -> dict[str, str]:
    """Return channel → granted/denied (a channel without an entry is unknown)."""
    out = {}
    roll = mix(i, 40) % 100
    if roll < 50:
        out[channel_of(i)] = "granted" if roll < 40 else "denied"
    if email_of(i) and mix(i, 41) % 2 == 0:
        out["email"] = "granted"
    return out


def contact_of(spec: Spec, i: int) -> Any:
    from crm.domain import Consent, Contact, Identity

    at = spec.base_ms + i
    identities = [
        Identity("whatsapp", phone_of(i)) if channel_of(i) == "whatsapp" else Identity("telegram", telegram_of(i))
    ]
    email = email_of(i)
    if email:
        identities.append(Identity("email", email))
    contact = Contact(
        id=contact_id_of(spec, i),
        identities=tuple(identities),
        name=name_of(i),
        tags=tuple(tags_of(i)),
        attributes=attributes_of(i),
        source="inbox",
        created_at=at,
        updated_at=at,
    )
    for channel, status in consent_of(i).items():
        contact = contact.with_consent(Consent(channel, status, at, "bench"))
    return contact


def peer_contact_row(spec: Spec, i: int) -> tuple[Any, ...]:
    from psycopg.types.json import Jsonb

    consent = consent_of(i)
    whatsapp = channel_of(i) == "whatsapp"
    return (
        contact_id_of(spec, i),
        spec.tenant,
        name_of(i),
        fold(name_of(i)),
        phone_of(i) if whatsapp else None,
        None if whatsapp else telegram_of(i),
        email_of(i),
        tags_of(i),
        Jsonb(attributes_of(i)),
        consent.get("whatsapp"),
        consent.get("telegram"),
        consent.get("email"),
        spec.base_ms + i,
    )


def status_of(i: int) -> str:
    roll = mix(i, 2) % 100
    return "open" if roll < 50 else "pending" if roll < 65 else "resolved"


def assignee_of(i: int) -> str | None:
    roll = mix(i, 3) % 100
    return "ana" if roll < 30 else "ben" if roll < 50 else None


def messages_of(i: int) -> list[Any]:
    """Return conversation i's messages: an inbound one, maybe a bot reply, maybe a second inbound one."""
    from inbox.domain import Message

    channel = channel_of(i)
    address = phone_of(i)[1:] if channel == "whatsapp" else telegram_of(i)
    sender, cid, t0 = (
        f"{channel}:{address}",
        conversation_id_of(i),
        0,
    )  # t0 added by conversation_of
    out = [
        Message(
            id=f"wamid.s{i:09d}a",
            conversation_id=cid,
            direction="in",
            type="text",
            timestamp_ms=t0,
            text=f"Hola, quiero saber de mi pedido {i}",
            sender_id=sender,
            sender_name=name_of(i),
            provider_message_id=f"wamid.s{i:09d}a",
            source="webhook",
        )
    ]
    if mix(i, 50) % 3 == 0:
        out.append(
            Message(
                id=f"led.s{i:09d}b",
                conversation_id=cid,
                direction="out",
                type="text",
                timestamp_ms=t0 + 300,
                text="¡Gracias! Ya revisamos tu pedido.",
                sender_id="bot",
                source="ledger",
                provider_message_id=f"wamid.s{i:09d}b",
                status="sent",
                status_at_ms=t0 + 300,
            )
        )
    if mix(i, 51) % 5 == 0:
        out.append(
            Message(
                id=f"wamid.s{i:09d}c",
                conversation_id=cid,
                direction="in",
                type="text",
                timestamp_ms=t0 + 600,
                text="¿Y cuándo llega?",
                sender_id=sender,
                sender_name=name_of(i),
                provider_message_id=f"wamid.s{i:09d}c",
                source="webhook",
            )
        )
    return out


def conversation_of(spec: Spec, i: int) -> tuple[Any, tuple[Any, ...]]:
    """Return conversation i as the projection leaves it after its messages, an assignment and a status."""
    from dataclasses import replace

    from inbox.domain import Conversation, preview

    t0 = spec.base_ms + i * STEP_MS
    messages = tuple(
        replace(m, timestamp_ms=m.timestamp_ms + t0, status_at_ms=m.status_at_ms and m.status_at_ms + t0)
        for m in messages_of(i)
    )
    last = messages[-1]
    inbound = [m for m in messages if m.direction == "in"]
    channel = channel_of(i)
    address = phone_of(i)[1:] if channel == "whatsapp" else telegram_of(i)
    status, assignee = status_of(i), assignee_of(i)
    conversation = Conversation(
        id=conversation_id_of(i),
        chat_key=f"{channel}:{address}",
        channel=channel,
        # The tenant's one WhatsApp number and one Telegram bot received the chats: a
        # conversation belongs to the channel configuration that received it.
        channel_name=CHANNEL_NAMES[channel],
        created_at_ms=t0,
        status=status,
        assignee=assignee,
        version=1 + (assignee is not None) + (status != "open"),
        contact_id=contact_id_of(spec, i),
        display_name=name_of(i),
        last_activity_ms=last.timestamp_ms,
        last_message_id=last.id,
        last_text=preview(last.text),
        last_direction=last.direction,
        message_count=len(messages),
        inbound_count=len(inbound),
        last_inbound_ms=inbound[-1].timestamp_ms,
        updated_at_ms=last.timestamp_ms,
    )
    return conversation, messages


def markers_of(i: int) -> list[tuple[str, str, int]]:
    """Return ``(agent, message id, inbound messages read)`` of the read markers in conversation i."""
    messages = messages_of(i)
    out = []
    roll = mix(i, 4) % 100
    if roll < 35:  # ana read everything (25 %) or only the first message (10 %)
        upto = len(messages) if roll < 25 else 1
        out.append(("ana", messages[upto - 1].id, sum(1 for m in messages[:upto] if m.direction == "in")))
    if mix(i, 5) % 100 < 20:
        out.append(("ben", messages[-1].id, sum(1 for m in messages if m.direction == "in")))
    return out


def peer_conversation_row(spec: Spec, i: int) -> tuple[Any, ...]:
    conversation, messages = conversation_of(spec, i)
    c = conversation
    return (
        c.id,
        spec.tenant,
        c.chat_key,
        c.channel,
        c.status,
        c.assignee,
        c.contact_id,
        c.display_name,
        c.last_text,
        c.last_activity_ms,
        c.inbound_count,
        c.message_count,
    )


def delivery_of(spec: Spec, i: int) -> Any | None:
    """Return the campaign's delivery to contact i (every 4th contact, all on WhatsApp), or ``None``."""
    from campaigns.domain import Delivery

    if i % 4 != 0:
        return None
    roll = mix(i, 60) % 100
    state, reason = next((s, r) for bound, s, r in DELIVERY_STATES if roll < bound)
    at = spec.base_ms + i * STEP_MS
    extra: dict[str, Any] = {}
    if state == "accepted":
        extra = {
            "provider_message_id": f"wamid.camp{i:09d}",
            "provider_recipient": phone_of(i)[1:],
            "attempts": 1,
            "sends": 1,
        }
    elif state == "failed":
        extra = {
            "attempts": 1,
            "error_code": 131026,
            "error_title": "Message undeliverable",
            "retryable": False,
        }
    elif state == "in_doubt":
        extra = {"token": f"t{i}", "attempts": 0}
    return Delivery(
        recipient=phone_of(i),
        contact_id=contact_id_of(spec, i),
        chat_key=f"whatsapp:{phone_of(i)[1:]}",
        state=state,
        reason=reason,
        updated_at=at,
        **extra,
    )


# -- Kv wrappers: a write-back loader and a call counter -------------------------------------


class WriteBackKv:
    """A DurableKv that merges consecutive commits into one (a bulk loader for fresh records).

    ``commit`` holds the ops and answers with the entries they will write
    (version 1 for a new key, ``n + 1`` for an expected version ``n``); the held
    ops go to the real Kv in one commit once ``max_ops`` are held, before a
    commit to another table, before an op that cannot merge with a held one on
    the same key (identical ``Check``s merge, ``Add``s sum) and before any read
    that could see a held key. A failure at that commit fails the build (only
    fresh records are written, so none is expected); the versions the real Kv
    answers are checked against those promised.
    """

    def __init__(self, kv: Any, max_ops: int = 800) -> None:
        from botmesh_admin.kv import Add, Check, Delete, Put

        self.kv, self.url, self.max_ops = kv, kv.url, max_ops
        self._types = (Add, Check, Delete, Put)
        self._table: str | None = None
        self._ops: dict[str, Any] = {}
        self._promised: dict[str, int] = {}
        self.commits = self.flushes = 0

    def _merges(self, ops: Sequence[Any]) -> bool:
        add, check = self._types[0], self._types[1]
        for op in ops:
            held = self._ops.get(op.key)
            if held is None or (isinstance(op, add) and isinstance(held, add)):
                continue
            if isinstance(op, check) and isinstance(held, check) and op.expect == held.expect:
                continue
            return False
        return True

    def commit(self, table: str, ops: Sequence[Any]) -> list[Any]:
        from botmesh_admin.kv import ABSENT, ANY, Entry

        add, check, delete, _put = self._types
        if self._ops and (table != self._table or not self._merges(ops)):
            self.flush()
        self._table = table
        results: list[Any] = []
        for op in ops:
            held = self._ops.get(op.key)
            if isinstance(op, add):
                self._ops[op.key] = add(op.key, op.delta + (held.delta if held is not None else 0))
                results.append(Entry(op.key, op.delta, 1))
            elif isinstance(op, check):
                self._ops.setdefault(op.key, op)
                checked = op.expect if isinstance(op.expect, int) else None
                results.append(None if checked is None else Entry(op.key, None, checked))
            elif isinstance(op, delete):
                self._ops[op.key] = op
                results.append(None)
            else:
                version = 1 if op.expect in (ABSENT, ANY) else op.expect + 1
                self._ops[op.key] = op
                if op.expect is not ANY:
                    self._promised[op.key] = version
                results.append(Entry(op.key, op.value, version))
        self.commits += 1
        if len(self._ops) >= self.max_ops:
            self.flush()
        return results

    def flush(self) -> None:
        """Commit every held op in one commit of the real Kv."""
        if not self._ops:
            return
        table, ops, promised = self._table, list(self._ops.values()), self._promised
        self._ops, self._promised = {}, {}
        assert table is not None
        written = self.kv.commit(table, ops)
        for op, entry in zip(ops, written, strict=True):
            if op.key in promised and (entry is None or entry.version != promised[op.key]):
                raise RuntimeError(f"{table} {op.key}: promised version {promised[op.key]}, wrote {entry}")
        self.flushes += 1

    def _holds(self, table: str, keys: Sequence[str] = (), prefix: str | None = None) -> bool:
        if table != self._table or not self._ops:
            return False
        check = self._types[1]
        if prefix is not None:
            return any(k.startswith(prefix) and not isinstance(op, check) for k, op in self._ops.items())
        return any(k in self._ops and not isinstance(self._ops[k], check) for k in keys)

    def get(self, table: str, key: str) -> Any:
        if self._holds(table, [key]):
            self.flush()
        return self.kv.get(table, key)

    def get_many(self, table: str, keys: Sequence[str]) -> list[Any]:
        if self._holds(table, keys):
            self.flush()
        return self.kv.get_many(table, keys)

    def scan(self, table: str, prefix: str = "", after: str | None = None, limit: int = 100) -> list[Any]:
        if self._holds(table, prefix=prefix):
            self.flush()
        return self.kv.scan(table, prefix=prefix, after=after, limit=limit)

    def drop(self, table: str) -> None:
        self.flush()
        self.kv.drop(table)

    def sweep(self, limit: int = 1000) -> int:
        return int(self.kv.sweep(limit))

    def ping(self) -> None:
        self.kv.ping()

    def close(self) -> None:
        self.flush()


class CountingKv:
    """A DurableKv that counts what the reads ask of the real one (calls and entries)."""

    def __init__(self, kv: Any) -> None:
        self.kv, self.url = kv, kv.url
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def _add(self, **amounts: int) -> None:
        with self._lock:
            for name, n in amounts.items():
                self.counts[name] = self.counts.get(name, 0) + n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)

    def get(self, table: str, key: str) -> Any:
        entry = self.kv.get(table, key)
        self._add(get=1, entries=entry is not None)
        return entry

    def get_many(self, table: str, keys: Sequence[str]) -> list[Any]:
        entries = self.kv.get_many(table, keys)
        self._add(get_many=1, keys=len(keys), entries=sum(1 for e in entries if e is not None))
        return entries

    def scan(self, table: str, prefix: str = "", after: str | None = None, limit: int = 100) -> list[Any]:
        entries = self.kv.scan(table, prefix=prefix, after=after, limit=limit)
        self._add(scan=1, entries=len(entries))
        return entries

    def commit(self, table: str, ops: Sequence[Any]) -> list[Any]:
        self._add(commit=1)
        return self.kv.commit(table, ops)

    def drop(self, table: str) -> None:
        self.kv.drop(table)

    def sweep(self, limit: int = 1000) -> int:
        return int(self.kv.sweep(limit))

    def ping(self) -> None:
        self.kv.ping()

    def close(self) -> None:
        pass


class CountingFollowKv(CountingKv):
    """A ``CountingKv`` over a Kv that has ``ScanFollow`` (so the kernel's choice is the real one)."""

    def scan_follow(
        self, table: str, prefix: str = "", after: str | None = None, limit: int = 100, *, field: str = "pk"
    ) -> list[Any]:
        pairs = self.kv.scan_follow(table, prefix=prefix, after=after, limit=limit, field=field)
        self._add(scan_follow=1, entries=len(pairs) + sum(1 for _, t in pairs if t is not None))
        return pairs


class CountingMergeKv(CountingFollowKv):
    """A ``CountingFollowKv`` over a Kv that also has ``ScanMerge``."""

    def scan_merge(
        self, table: str, prefixes: Sequence[str], after: str | None = None, limit: int = 100, *, field: str = "pk"
    ) -> list[Any]:
        pairs = self.kv.scan_merge(table, prefixes, after, limit, field=field)
        self._add(scan_merge=1, entries=len(pairs) + sum(1 for _, t in pairs if t is not None))
        return pairs


def counting_kv(kv: Any) -> CountingKv:
    """Return the counting wrapper of ``kv`` (with ``scan_follow`` and ``scan_merge`` when ``kv`` has them)."""
    if hasattr(kv, "scan_merge"):
        return CountingMergeKv(kv)
    return CountingFollowKv(kv) if hasattr(kv, "scan_follow") else CountingKv(kv)


# -- the peer schema --------------------------------------------------------------------------

PEER_COLUMNS = {
    "conversation": "id, tenant, chat_key, channel, status, assignee, contact_id, display_name, last_text, "
    "last_activity_ms, inbound_count, message_count",
    "readmarker": "conversation_id, agent, read_inbound",
    "contact": "id, tenant, name, name_folded, phone, telegram, email, tags, attributes, consent_whatsapp, "
    "consent_telegram, consent_email, created_at",
    "delivery": "campaign_id, recipient, contact_id, state, reason, updated_at",
}


def peer_ddl(p: str) -> list[str]:
    """Return the peer schema: what a Django model with ordinary indexes would migrate to."""
    return [
        f"CREATE TABLE IF NOT EXISTS {p}conversation (id text PRIMARY KEY, tenant text NOT NULL,"
        " chat_key text NOT NULL, channel text NOT NULL, status text NOT NULL, assignee text, contact_id text,"
        " display_name text, last_text text, last_activity_ms bigint NOT NULL, inbound_count integer NOT NULL,"
        " message_count integer NOT NULL)",
        f"CREATE UNIQUE INDEX IF NOT EXISTS {p}conv_chat ON {p}conversation (tenant, chat_key)",
        f"CREATE INDEX IF NOT EXISTS {p}conv_activity ON {p}conversation (tenant, last_activity_ms DESC, id)",
        f"CREATE INDEX IF NOT EXISTS {p}conv_assignee ON {p}conversation"
        " (tenant, assignee, status, last_activity_ms DESC)",
        f"CREATE INDEX IF NOT EXISTS {p}conv_status ON {p}conversation (tenant, status, last_activity_ms DESC)",
        f"CREATE INDEX IF NOT EXISTS {p}conv_channel ON {p}conversation"
        " (tenant, channel, status, last_activity_ms DESC)",
        f"CREATE TABLE IF NOT EXISTS {p}readmarker (conversation_id text NOT NULL, agent text NOT NULL,"
        " read_inbound integer NOT NULL, PRIMARY KEY (conversation_id, agent))",
        f"CREATE TABLE IF NOT EXISTS {p}contact (id text PRIMARY KEY, tenant text NOT NULL, name text,"
        " name_folded text, phone text, telegram text, email text, tags text[] NOT NULL, attributes jsonb NOT NULL,"
        " consent_whatsapp text, consent_telegram text, consent_email text, created_at bigint NOT NULL)",
        f"CREATE INDEX IF NOT EXISTS {p}contact_tenant ON {p}contact (tenant, id)",
        f"CREATE INDEX IF NOT EXISTS {p}contact_tags ON {p}contact USING gin (tags)",
        f"CREATE INDEX IF NOT EXISTS {p}contact_attrs ON {p}contact USING gin (attributes jsonb_path_ops)",
        f"CREATE INDEX IF NOT EXISTS {p}contact_cw ON {p}contact (tenant, consent_whatsapp, id)",
        f"CREATE INDEX IF NOT EXISTS {p}contact_ct ON {p}contact (tenant, consent_telegram, id)",
        f"CREATE INDEX IF NOT EXISTS {p}contact_ce ON {p}contact (tenant, consent_email, id)",
        f"CREATE INDEX IF NOT EXISTS {p}contact_name ON {p}contact (tenant, name_folded text_pattern_ops)",
        f"CREATE INDEX IF NOT EXISTS {p}contact_phone ON {p}contact (tenant, phone text_pattern_ops)",
        f"CREATE INDEX IF NOT EXISTS {p}contact_email ON {p}contact (tenant, email text_pattern_ops)",
        f"CREATE TABLE IF NOT EXISTS {p}delivery (campaign_id text NOT NULL, recipient text NOT NULL,"
        " contact_id text NOT NULL, state text NOT NULL, reason text, updated_at bigint NOT NULL,"
        " PRIMARY KEY (campaign_id, recipient))",
        f"CREATE INDEX IF NOT EXISTS {p}delivery_state ON {p}delivery (campaign_id, state, reason, recipient)",
    ]


STATE_DDL = (
    "CREATE TABLE IF NOT EXISTS scale_bench_tenant (tenant text PRIMARY KEY, kv_url text NOT NULL,"
    " base_ms bigint NOT NULL, meta jsonb NOT NULL DEFAULT '{}')",
    "CREATE TABLE IF NOT EXISTS scale_bench_chunk (tenant text NOT NULL, phase text NOT NULL, start integer NOT NULL,"
    " stop integer NOT NULL, state text NOT NULL, PRIMARY KEY (tenant, phase, start))",
)


def peer_models(prefix: str) -> dict[str, Any]:
    """Return unmanaged Django models over the peer tables (what a Django app would declare).

    They are registered under an installed app's label (``inbox``) only so that
    Django resolves the reverse relation of ``FilteredRelation("markers")``: an
    uninstalled app's models stay out of the relation tree.
    """
    from django.contrib.postgres.fields import ArrayField
    from django.db import models

    class ScalePeerConversation(models.Model):
        id = models.TextField(primary_key=True)
        tenant = models.TextField()
        chat_key = models.TextField()
        channel = models.TextField()
        status = models.TextField()
        assignee = models.TextField(null=True)
        contact_id = models.TextField(null=True)
        display_name = models.TextField(null=True)
        last_text = models.TextField(null=True)
        last_activity_ms = models.BigIntegerField()
        inbound_count = models.IntegerField()
        message_count = models.IntegerField()

        class Meta:
            app_label = "inbox"
            managed = False
            db_table = f"{prefix}conversation"

    class ScalePeerReadMarker(models.Model):
        pk = models.CompositePrimaryKey("conversation", "agent")
        conversation = models.ForeignKey(
            ScalePeerConversation,
            models.DO_NOTHING,
            related_name="markers",
            db_column="conversation_id",
        )
        agent = models.TextField()
        read_inbound = models.IntegerField()

        class Meta:
            app_label = "inbox"
            managed = False
            db_table = f"{prefix}readmarker"

    class ScalePeerContact(models.Model):
        id = models.TextField(primary_key=True)
        tenant = models.TextField()
        name = models.TextField(null=True)
        name_folded = models.TextField(null=True)
        phone = models.TextField(null=True)
        telegram = models.TextField(null=True)
        email = models.TextField(null=True)
        tags = ArrayField(models.TextField())
        attributes = models.JSONField()
        consent_whatsapp = models.TextField(null=True)
        consent_telegram = models.TextField(null=True)
        consent_email = models.TextField(null=True)
        created_at = models.BigIntegerField()

        class Meta:
            app_label = "inbox"
            managed = False
            db_table = f"{prefix}contact"

    class ScalePeerDelivery(models.Model):
        pk = models.CompositePrimaryKey("campaign_id", "recipient")
        campaign_id = models.TextField()
        recipient = models.TextField()
        contact_id = models.TextField()
        state = models.TextField()
        reason = models.TextField(null=True)
        updated_at = models.BigIntegerField()

        class Meta:
            app_label = "inbox"
            managed = False
            db_table = f"{prefix}delivery"

    return {
        "Conversation": ScalePeerConversation,
        "ReadMarker": ScalePeerReadMarker,
        "Contact": ScalePeerContact,
        "Delivery": ScalePeerDelivery,
    }


# -- the build ---------------------------------------------------------------------------------


class Builder:
    """Writes chunks of one phase: ours through the stores (over a ``WriteBackKv``), the peer by COPY."""

    def __init__(self, kv: Any, db_url: str) -> None:
        import psycopg

        self.kv = kv
        self.loader = WriteBackKv(kv)
        self.pg = psycopg.connect(db_url, autocommit=True)

    def chunk(self, spec: Spec, phase: str, start: int, stop: int, careful: bool) -> tuple[str, int, int, float]:
        """Build items ``start..stop`` of ``phase``; ``careful`` skips what a killed run already wrote."""
        from botmesh_admin.kv.runtime import use_kv

        began = time.perf_counter()
        self.pg.execute(
            "INSERT INTO scale_bench_chunk VALUES (%s, %s, %s, %s, 'started') ON CONFLICT (tenant, phase, start)"
            " DO UPDATE SET state = 'started'",
            (spec.tenant, phase, start, stop),
        )
        with use_kv(self.loader):
            rows = getattr(self, f"_{phase}")(spec, range(start, stop), careful)
            self.loader.flush()
        with self.pg.transaction(), self.pg.cursor() as cursor:
            for table, items in rows.items():
                with cursor.copy(f"COPY {spec.prefix}{table} ({PEER_COLUMNS[table]}) FROM STDIN") as copy:
                    for row in items:
                        copy.write_row(row)
            cursor.execute(
                "UPDATE scale_bench_chunk SET state = 'done' WHERE tenant = %s AND phase = %s AND start = %s",
                (spec.tenant, phase, start),
            )
        return phase, start, stop, time.perf_counter() - began

    def _contacts(self, spec: Spec, items: range, careful: bool) -> dict[str, list[tuple[Any, ...]]]:
        from crm.domain import validate_contact
        from crm.stores import default_store

        store = default_store()
        for i in items:
            contact = contact_of(spec, i)
            if careful and store.contact_get(spec.tenant, contact.id) is not None:
                continue
            store.contact_insert(spec.tenant, validate_contact(contact))
        return {"contact": [peer_contact_row(spec, i) for i in items]}

    def _conversations(self, spec: Spec, items: range, careful: bool) -> dict[str, list[tuple[Any, ...]]]:
        from inbox.domain import validate_conversation, validate_message
        from inbox.stores import default_store
        from inbox.stores.base import Change

        store = default_store()
        for i in items:
            conversation, messages = conversation_of(spec, i)
            if careful and store.conversation_get(spec.tenant, conversation.id) is not None:
                continue
            store.write(
                spec.tenant,
                Change(
                    conversation=validate_conversation(conversation),
                    messages=tuple(validate_message(m) for m in messages),
                ),
            )
        return {"conversation": [peer_conversation_row(spec, i) for i in items]}

    def _markers(self, spec: Spec, items: range, careful: bool) -> dict[str, list[tuple[Any, ...]]]:
        from inbox.services import read_marker_set

        rows = []  # through the service: a marker moves only forward, so a redo is harmless
        for i in items:
            for agent, message_id, read in markers_of(i):
                read_marker_set(spec.tenant, conversation_id_of(i), agent=agent, message_id=message_id)
                rows.append((conversation_id_of(i), agent, read))
        return {"readmarker": rows}

    def _deliveries(self, spec: Spec, items: range, careful: bool) -> dict[str, list[tuple[Any, ...]]]:
        from campaigns.stores import default_store

        _, slots = default_store()
        deliveries = [d for d in (delivery_of(spec, i) for i in items) if d is not None]
        todo = deliveries
        if careful:
            todo = [d for d in deliveries if slots.slot_get(spec.tenant, spec.campaign_id, d.recipient) is None]
        slots.slots_add(spec.tenant, spec.campaign_id, todo)
        return {
            "delivery": [
                (spec.campaign_id, d.recipient, d.contact_id, d.state, d.reason, d.updated_at) for d in deliveries
            ]
        }


_builder: Builder | None = None


def worker_init(env: dict[str, str]) -> None:
    """Set up a builder process: Django, its own Kv connection, its own peer connection."""
    global _builder
    django_setup(env)
    from botmesh_admin.kv import connect

    _builder = Builder(connect(env["BOTMESH_KV_URL"]), env["BOTMESH_BENCH_DB"])


def worker_chunk(task: tuple[dict[str, Any], str, int, int, bool]) -> tuple[str, int, int, float]:
    spec, phase, start, stop, careful = task
    assert _builder is not None
    return _builder.chunk(Spec(**spec), phase, start, stop, careful)


def reach(pg: Any, spec: Spec) -> int:
    """Return the end of the furthest chunk any build started (done or killed) in any phase.

    A tenant measured at a size must hold nothing beyond it: a killed chunk may
    have written records the peer lacks.
    """
    row = pg.execute("SELECT max(stop) FROM scale_bench_chunk WHERE tenant = %s", (spec.tenant,)).fetchone()
    return int(row[0] or 0)


def pending_chunks(pg: Any, spec: Spec, phase: str, size: int) -> list[tuple[int, int, bool]]:
    """Return ``(start, stop, careful)`` of the chunks of ``phase`` below ``size`` not done yet."""
    states = dict(
        pg.execute(
            "SELECT start, state FROM scale_bench_chunk WHERE tenant = %s AND phase = %s",
            (spec.tenant, phase),
        ).fetchall()
    )
    out = []
    for start in range(0, size, CHUNK):
        if states.get(start) != "done":
            out.append((start, min(size, start + CHUNK), states.get(start) == "started"))
    return out


def build(spec: Spec, size: int, *, jobs: int, env: dict[str, str], main_builder: Builder) -> dict[str, float]:
    """Bring the tenant to ``size`` items in every phase; return seconds per phase.

    The first chunk of a phase runs here alone (it creates each table's index
    states, which two first writers would race for), the rest on ``jobs`` processes.
    """
    seconds: dict[str, float] = {}
    pool = None
    try:
        for phase in PHASES:
            chunks = pending_chunks(main_builder.pg, spec, phase, size)
            if not chunks:
                continue
            began = time.perf_counter()
            done = 0
            total = sum(stop - start for start, stop, _ in chunks)
            if chunks[0][0] == 0:
                start, stop, careful = chunks.pop(0)
                main_builder.chunk(spec, phase, start, stop, careful)
                done += stop - start
            if chunks:
                if pool is None:
                    pool = multiprocessing.get_context("spawn").Pool(jobs, initializer=worker_init, initargs=(env,))
                tasks = [(spec.__dict__, phase, start, stop, careful) for start, stop, careful in chunks]
                for _, start, stop, _ in pool.imap_unordered(worker_chunk, tasks):
                    done += stop - start
                    elapsed = time.perf_counter() - began
                    print(
                        f"\r  build {phase:<13} {done:>9,}/{total:,}  {done / elapsed:7.0f}/s",
                        end="",
                        flush=True,
                    )
            seconds[phase] = time.perf_counter() - began
            print(
                f"\r  build {phase:<13} {total:>9,} items in {seconds[phase]:7.1f} s "
                f"({total / seconds[phase]:.0f}/s)   "
            )
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    return seconds


def campaign_settle(spec: Spec, size: int) -> None:
    """Leave the campaign as a run that planned every delivery and was paused leaves it.

    A draft has no deliveries; its page would show the plan preview instead
    (measured apart as ``campaign_plan_of``).
    """
    from dataclasses import replace

    from campaigns.domain import PlanCounts
    from campaigns.stores import default_store

    campaigns, _ = default_store()
    campaign = campaigns.campaign_get(spec.tenant, spec.campaign_id)
    assert campaign is not None
    planned = len(range(0, size, 4))
    if campaign.state == "paused" and campaign.plan and campaign.plan.recipients == planned:
        return
    campaigns.campaign_replace(
        spec.tenant,
        replace(campaign, state="paused", plan=PlanCounts(planned, planned), started_at=spec.base_ms),
        expected_version=campaign.version,
    )


def tenant_spec(pg: Any, tenant: str, kv_url: str) -> Spec:
    """Return the tenant's spec, registering a new tenant (Django row, segments, campaign) first."""
    from psycopg.types.json import Jsonb

    from botmesh_admin.tenancy.models import Tenant
    from botmesh_admin.tenancy.services import tenant_create

    row = pg.execute("SELECT kv_url, base_ms, meta FROM scale_bench_tenant WHERE tenant = %s", (tenant,)).fetchone()
    if row is None:
        base_ms = (int(time.time()) - 40 * 86400) * 1000  # a million conversations span 12 days, all in the past
        pg.execute(
            "INSERT INTO scale_bench_tenant (tenant, kv_url, base_ms) VALUES (%s, %s, %s)",
            (tenant, kv_url, base_ms),
        )
        row = (kv_url, base_ms, {})
    if row[0] != kv_url:
        raise SystemExit(f"tenant {tenant} was built on {row[0]}, not {kv_url}: pass that --kv or another --tenant")
    meta = dict(row[2])
    if not Tenant.objects.filter(id=tenant).exists():
        tenant_create(tenant, name=f"Scale {tenant}")
    if "segments" not in meta:
        from crm.services import segment_create

        meta["segments"] = {name: segment_create(tenant, name=name, rules=rules).id for name, rules in SEGMENTS.items()}
        pg.execute("UPDATE scale_bench_tenant SET meta = %s WHERE tenant = %s", (Jsonb(meta), tenant))
    if "campaign_id" not in meta:
        from campaigns.services import campaign_create

        meta["campaign_id"] = campaign_create(
            tenant,
            name="Scale",
            segment_id=meta["segments"]["whatsapp-optin"],
            channel="whatsapp",
            message={"template": "promo_scale", "language": "es"},
        ).id
        pg.execute("UPDATE scale_bench_tenant SET meta = %s WHERE tenant = %s", (Jsonb(meta), tenant))
    spec = Spec(tenant, row[1], meta["campaign_id"], meta["segments"])
    for statement in peer_ddl(spec.prefix):
        pg.execute(statement)
    return spec


def drop_tenant(pg: Any, kv: Any, tenant: str) -> None:
    """Remove the tenant's Kv tables, peer tables, progress rows and Django row."""
    from botmesh_admin.tenancy.models import Tenant

    tables: list[str] = []
    for package in PACKAGES:
        tables += kv.tables(f"{package}/{tenant}/")
    for table in tables:
        kv.drop(table)
    prefix = Spec(tenant, 0).prefix
    for name in PEER_COLUMNS:
        pg.execute(f"DROP TABLE IF EXISTS {prefix}{name}")
    (ROOT / "bench" / "results" / f"scale_{tenant}.json").unlink(missing_ok=True)
    pg.execute("DELETE FROM scale_bench_chunk WHERE tenant = %s", (tenant,))
    pg.execute("DELETE FROM scale_bench_tenant WHERE tenant = %s", (tenant,))
    Tenant.objects.filter(id=tenant).delete()
    print(f"dropped tenant {tenant}: {len(tables)} Kv tables, its peer tables and its Django row")


# -- the reads ---------------------------------------------------------------------------------


@dataclass
class Read:
    """One read a page makes: ours, the Django ORM's and raw SQL's, each returning a comparable answer."""

    name: str
    ours: Callable[[], Any]
    orm: Callable[[], Any] | None
    raw: Callable[[], Any] | None
    note: str = ""


def first_callable(module: Any, names: Sequence[str]) -> Callable[..., Any] | None:
    for name in names:
        if callable(getattr(module, name, None)):
            return getattr(module, name)
    return None


def accepts(fn: Callable[..., Any], name: str) -> bool:
    import inspect

    return name in inspect.signature(fn).parameters


class Peer:
    """The peer's raw SQL (psycopg) and its Django models."""

    def __init__(self, spec: Spec, db_url: str) -> None:
        import psycopg

        self.spec, self.p = spec, spec.prefix
        self.pg = psycopg.connect(db_url, autocommit=True)
        self.m = peer_models(spec.prefix)

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.pg.execute(sql.replace("{p}", self.p), params).fetchall()

    # conversations

    def conversation_where(
        self, view: str, status: str | None, channel: str | None, unread_only: bool
    ) -> tuple[str, list[Any]]:
        clauses, params = ["c.tenant = %s"], [self.spec.tenant]
        if view == "mine":
            clauses.append("c.assignee = %s")
            params.append(AGENT)
        elif view == "unassigned":
            clauses.append("c.assignee IS NULL")
        if status:
            clauses.append("c.status = %s")
            params.append(status)
        if channel:
            clauses.append("c.channel = %s")
            params.append(channel)
        if unread_only:
            clauses.append("c.inbound_count > COALESCE(r.read_inbound, 0)")
        return " AND ".join(clauses), params

    def conversation_page(
        self,
        view: str,
        status: str | None,
        channel: str | None,
        unread_only: bool,
        after: tuple[int, str] | None,
    ) -> list[tuple[str, int]]:
        where, params = self.conversation_where(view, status, channel, unread_only)
        if after is not None:
            where += " AND (c.last_activity_ms < %s OR (c.last_activity_ms = %s AND c.id > %s))"
            params += [after[0], after[0], after[1]]
        return [
            tuple(r)
            for r in self.rows(  # type: ignore[misc]
                "SELECT c.id, c.inbound_count - COALESCE(r.read_inbound, 0) FROM {p}conversation c"
                " LEFT JOIN {p}readmarker r ON r.conversation_id = c.id AND r.agent = %s"
                f" WHERE {where} ORDER BY c.last_activity_ms DESC, c.id LIMIT {PAGE}",
                [AGENT, *params],
            )
        ]

    def conversation_after(self, conversation_id: str) -> tuple[int, str]:
        """Return the keyset ``(last_activity_ms, id)`` of a conversation (where a page ended)."""
        rows = self.rows("SELECT last_activity_ms, id FROM {p}conversation WHERE id = %s", (conversation_id,))
        return rows[0][0], rows[0][1]

    def orm_conversations(self, view: str, status: str | None, channel: str | None, unread_only: bool) -> Any:
        from django.db.models import F, FilteredRelation, Q
        from django.db.models.functions import Coalesce

        qs = self.m["Conversation"].objects.filter(tenant=self.spec.tenant)
        if view == "mine":
            qs = qs.filter(assignee=AGENT)
        elif view == "unassigned":
            qs = qs.filter(assignee__isnull=True)
        if status:
            qs = qs.filter(status=status)
        if channel:
            qs = qs.filter(channel=channel)
        qs = qs.annotate(mark=FilteredRelation("markers", condition=Q(markers__agent=AGENT)))
        qs = qs.annotate(unread=F("inbound_count") - Coalesce(F("mark__read_inbound"), 0))
        if unread_only:
            qs = qs.filter(unread__gt=0)
        return qs

    def orm_conversation_page(
        self,
        view: str,
        status: str | None,
        channel: str | None,
        unread_only: bool,
        after: tuple[int, str] | None,
    ) -> list[tuple[str, int]]:
        from django.db.models import Q

        qs = self.orm_conversations(view, status, channel, unread_only)
        if after is not None:
            qs = qs.filter(Q(last_activity_ms__lt=after[0]) | Q(last_activity_ms=after[0], id__gt=after[1]))
        return [tuple(r) for r in qs.order_by("-last_activity_ms", "id").values_list("id", "unread")[:PAGE]]

    def unread_total(self) -> int:
        return int(
            self.rows(
                "SELECT COALESCE(SUM(c.inbound_count - COALESCE(r.read_inbound, 0)), 0)"
                " FROM {p}conversation c LEFT JOIN {p}readmarker r ON r.conversation_id = c.id"
                " AND r.agent = %s WHERE c.tenant = %s",
                (AGENT, self.spec.tenant),
            )[0][0]
        )

    def orm_unread_total(self) -> int:
        from django.db.models import Sum

        return int(self.orm_conversations("all", None, None, False).aggregate(n=Sum("unread"))["n"] or 0)

    @staticmethod
    def view_counts(groups: Sequence[tuple[str, str | None, int]]) -> dict[str, int]:
        """Fold ``(status, assignee, count)`` groups into ``{"<view>/<status or any>": count}``."""
        out: dict[str, int] = {}
        for status, assignee, n in groups:
            views = ["all"] + (["mine"] if assignee == AGENT else []) + (["unassigned"] if assignee is None else [])
            for view in views:
                for key in (f"{view}/{status}", f"{view}/any"):
                    out[key] = out.get(key, 0) + n
        return dict(sorted(out.items()))

    def list_counts(self) -> dict[str, int]:
        return self.view_counts(
            self.rows(
                "SELECT status, assignee, count(*) FROM {p}conversation WHERE tenant = %s GROUP BY status, assignee",
                (self.spec.tenant,),
            )
        )

    def orm_list_counts(self) -> dict[str, int]:
        from django.db.models import Count

        qs = self.m["Conversation"].objects.filter(tenant=self.spec.tenant).values("status", "assignee")
        return self.view_counts([(g["status"], g["assignee"], g["n"]) for g in qs.annotate(n=Count("id")).order_by()])

    # contacts

    CONTACT_SQL = {
        "all": ("TRUE", ()),
        "tag": ("tags @> %s", None),
        "consent": ("consent_whatsapp = %s AND phone IS NOT NULL", None),
        "attribute": ("attributes @> %s", None),
        "name": ("name_folded LIKE %s", None),
        "phone": ("phone LIKE %s", None),
        "email": ("email LIKE %s", None),
    }

    def contact_page(self, kind: str, value: Any) -> list[str]:
        from psycopg.types.json import Jsonb

        clause = self.CONTACT_SQL[kind][0]
        params: list[Any] = [self.spec.tenant]
        if kind != "all":
            params.append(
                Jsonb(value)
                if kind == "attribute"
                else [value]
                if kind == "tag"
                else value + "%"
                if kind in ("name", "phone", "email")
                else value
            )
        return [
            r[0]
            for r in self.rows(
                f"SELECT id FROM {{p}}contact WHERE tenant = %s AND {clause} ORDER BY id LIMIT {PAGE}",
                params,
            )
        ]

    def orm_contact_page(self, kind: str, value: Any) -> list[str]:
        qs = self.m["Contact"].objects.filter(tenant=self.spec.tenant)
        filters = {
            "all": {},
            "tag": {"tags__contains": [value]},
            "consent": {"consent_whatsapp": value, "phone__isnull": False},
            "attribute": {"attributes__contains": value},
            "name": {"name_folded__startswith": value},
            "phone": {"phone__startswith": value},
            "email": {"email__startswith": value},
        }[kind]
        return list(qs.filter(**filters).order_by("id").values_list("id", flat=True)[:PAGE])

    @staticmethod
    def segment_sql(rules: dict[str, Any]) -> tuple[str, list[Any]]:
        from psycopg.types.json import Jsonb

        clauses: list[str] = []
        params: list[Any] = []
        if rules.get("tags_all"):
            clauses.append("tags @> %s")
            params.append(list(rules["tags_all"]))
        if rules.get("tags_any"):
            clauses.append("tags && %s")
            params.append(list(rules["tags_any"]))
        if rules.get("attributes"):
            clauses.append("attributes @> %s")
            params.append(Jsonb(rules["attributes"]))
        if rules.get("consent_required"):
            channel = rules["consent_required"]
            clauses.append(
                f"consent_{channel} = 'granted' AND {'phone' if channel == 'whatsapp' else channel} IS NOT NULL"
            )
        return " AND ".join(clauses) or "TRUE", params

    @staticmethod
    def segment_q(rules: dict[str, Any]) -> Any:
        from django.db.models import Q

        q = Q()
        if rules.get("tags_all"):
            q &= Q(tags__contains=list(rules["tags_all"]))
        if rules.get("tags_any"):
            q &= Q(tags__overlap=list(rules["tags_any"]))
        if rules.get("attributes"):
            q &= Q(attributes__contains=rules["attributes"])
        if rules.get("consent_required"):
            channel = rules["consent_required"]
            q &= Q(
                **{
                    f"consent_{channel}": "granted",
                    f"{'phone' if channel == 'whatsapp' else channel}__isnull": False,
                }
            )
        return q

    def segment_count(self, rules: dict[str, Any]) -> int:
        where, params = self.segment_sql(rules)
        return int(
            self.rows(
                f"SELECT count(*) FROM {{p}}contact WHERE tenant = %s AND {where}",
                [self.spec.tenant, *params],
            )[0][0]
        )

    def orm_segment_count(self, rules: dict[str, Any]) -> int:
        return int(self.m["Contact"].objects.filter(tenant=self.spec.tenant).filter(self.segment_q(rules)).count())

    def segment_preview(self, rules: dict[str, Any]) -> tuple[int, list[str]]:
        where, params = self.segment_sql(rules)
        ids = [
            r[0]
            for r in self.rows(
                f"SELECT id FROM {{p}}contact WHERE tenant = %s AND {where} ORDER BY id LIMIT {PAGE}",
                [self.spec.tenant, *params],
            )
        ]
        return self.segment_count(rules), ids

    def orm_segment_preview(self, rules: dict[str, Any]) -> tuple[int, list[str]]:
        qs = self.m["Contact"].objects.filter(tenant=self.spec.tenant).filter(self.segment_q(rules))
        return qs.count(), list(qs.order_by("id").values_list("id", flat=True)[:PAGE])

    def segment_counts(self) -> dict[str, int]:
        parts: list[str] = []
        params: list[Any] = []
        for rules in SEGMENTS.values():
            where, more = self.segment_sql(rules)
            parts.append(f"count(*) FILTER (WHERE {where})")
            params += more
        # The FILTER clauses come before the WHERE: their parameters first, the tenant's last.
        row = self.rows(
            f"SELECT {', '.join(parts)} FROM {{p}}contact WHERE tenant = %s",
            [*params, self.spec.tenant],
        )[0]
        return {self.spec.segments[name]: int(n) for name, n in zip(SEGMENTS, row, strict=True)}

    def orm_segment_counts(self) -> dict[str, int]:
        from django.db.models import Count

        counts = (
            self.m["Contact"]
            .objects.filter(tenant=self.spec.tenant)
            .aggregate(
                **{f"s{n}": Count("id", filter=self.segment_q(rules)) for n, rules in enumerate(SEGMENTS.values())}
            )
        )
        return {self.spec.segments[name]: int(counts[f"s{n}"]) for n, name in enumerate(SEGMENTS)}

    def contact_total(self) -> int:
        return int(self.rows("SELECT count(*) FROM {p}contact WHERE tenant = %s", (self.spec.tenant,))[0][0])

    def orm_contact_total(self) -> int:
        return int(self.m["Contact"].objects.filter(tenant=self.spec.tenant).count())

    # campaigns

    @staticmethod
    def progress_of(groups: Sequence[tuple[str, str | None, int]]) -> dict[str, Any]:
        states: dict[str, int] = {}
        reasons: dict[str, int] = {}
        for state, reason, n in groups:
            states[state] = states.get(state, 0) + n
            if state in ("failed", "dropped", "cancelled", "in_doubt") and reason:
                reasons[f"{state}:{reason}"] = reasons.get(f"{state}:{reason}", 0) + n
        return {
            "total": sum(states.values()),
            "states": dict(sorted(states.items())),
            "reasons": dict(sorted(reasons.items())),
        }

    def progress(self) -> dict[str, Any]:
        return self.progress_of(
            self.rows(
                "SELECT state, reason, count(*) FROM {p}delivery WHERE campaign_id = %s GROUP BY state, reason",
                (self.spec.campaign_id,),
            )
        )

    def orm_progress(self) -> dict[str, Any]:
        from django.db.models import Count

        qs = self.m["Delivery"].objects.filter(campaign_id=self.spec.campaign_id).values("state", "reason")
        return self.progress_of([(g["state"], g["reason"], g["n"]) for g in qs.annotate(n=Count("*")).order_by()])

    def delivery_page(self, state: str, reason: str | None) -> list[str]:
        extra, params = ("AND reason = %s", [reason]) if reason else ("", [])
        return [
            r[0]
            for r in self.rows(
                f"SELECT recipient FROM {{p}}delivery WHERE campaign_id = %s AND state = %s"
                f" {extra} ORDER BY recipient LIMIT {PAGE}",
                [self.spec.campaign_id, state, *params],
            )
        ]

    def orm_delivery_page(self, state: str, reason: str | None) -> list[str]:
        qs = self.m["Delivery"].objects.filter(campaign_id=self.spec.campaign_id, state=state)
        if reason:
            qs = qs.filter(reason=reason)
        return list(qs.order_by("recipient").values_list("recipient", flat=True)[:PAGE])


def pick(size: int, predicate: Callable[[int], bool], start: int) -> int:
    """Return the first index from ``start`` (wrapping below ``size``) that satisfies ``predicate``."""
    return next(i for i in itertools.chain(range(min(start, size - 1), size), range(size)) if predicate(i))


def build_reads(spec: Spec, peer: Peer, size: int, *, with_pages: bool = True) -> list[Read]:
    """Return every read of the benchmark at ``size`` (deep cursors are walked here, untimed)."""
    from campaigns import selectors as campaign_selectors
    from crm import selectors as crm
    from inbox import selectors as inbox

    tenant = spec.tenant
    reads: list[Read] = []

    # -- inbox
    def ours_page(
        view: str, status: str | None, channel: str | None, unread_only: bool, after: str | None
    ) -> list[tuple[str, int]]:
        rows, _ = inbox.conversation_list(
            tenant, agent=AGENT, view=view, status=status, channel=channel,
            unread_only=unread_only, limit=PAGE, after=after,
        )  # fmt: skip
        return [(r.conversation.id, r.unread) for r in rows]

    combos: list[tuple[str, str | None, str | None, bool]] = [
        (view, status, channel, False)
        for view in ("all", "mine", "unassigned")
        for status, channel in ((None, None), ("open", None), (None, "telegram"))
    ]
    combos += [("all", None, None, True), ("mine", "pending", "telegram", False)]
    for combo in combos:
        view, status, channel, unread_only = combo
        label = (
            f"conversation_list {view}"
            + (f" status={status}" if status else "")
            + (f" channel={channel}" if channel else "")
            + (" unread_only" if unread_only else "")
        )
        reads.append(
            Read(
                f"{label} · first page",
                partial(ours_page, *combo, None),
                partial(peer.orm_conversation_page, *combo, None),
                partial(peer.conversation_page, *combo, None),
            )
        )
        if unread_only:
            continue
        cursor, pages, last = None, 0, None
        while pages < DEEP_PAGES:
            rows, cursor = inbox.conversation_list(
                tenant, agent=AGENT, view=view, status=status, channel=channel, limit=PAGE,
                after=cursor,
            )  # fmt: skip
            pages += 1
            last = rows[-1].conversation.id if rows else last
            if cursor is None:
                break
        if cursor is None or last is None:
            continue  # the list is shorter than a deep page at this size
        # The peer continues after the last row ours showed (a page may be short: the same place).
        keyset = peer.conversation_after(last)
        reads.append(
            Read(
                f"{label} · page {pages + 1} (cursor)",
                partial(ours_page, *combo, cursor),
                partial(peer.orm_conversation_page, *combo, keyset),
                partial(peer.conversation_page, *combo, keyset),
            )
        )

    reads.append(
        Read(
            "unread_total (agent ana, all)",
            partial(inbox.unread_total, tenant, agent=AGENT),
            peer.orm_unread_total,
            peer.unread_total,
        )
    )
    counts = first_callable(
        inbox,
        ("conversation_counts", "conversation_list_counts", "list_counts", "conversation_count"),
    )
    if counts is not None:
        reads.append(
            Read(
                f"list counts per view/status ({counts.__name__})",
                lambda: normalize_counts(counts(tenant, agent=AGENT)),
                peer.orm_list_counts,
                peer.list_counts,
            )
        )
    else:
        reads.append(
            Read(
                "list counts per view/status",
                partial(counts_by_paging, tenant),
                peer.orm_list_counts,
                peer.list_counts,
                "no count selector: one pass over conversation_list pages",
            )
        )

    # -- crm
    contact_params = {p for p in ("consent", "attribute", "attributes") if accepts(crm.contact_list, p)}

    def ours_contacts(**filters: Any) -> list[str]:
        return [c.id for c in crm.contact_list(tenant, limit=PAGE, **filters).items]

    def members_page(rules: dict[str, Any]) -> list[str]:
        return [c.id for c in itertools.islice(crm.segment_members(tenant, rules), PAGE)]

    reads.append(
        Read(
            "contact_list · first page",
            ours_contacts,
            partial(peer.orm_contact_page, "all", None),
            partial(peer.contact_page, "all", None),
        )
    )
    for tag in ("vip", "embajador"):
        reads.append(
            Read(
                f"contact_list tag={tag}",
                partial(ours_contacts, tag=tag),
                partial(peer.orm_contact_page, "tag", tag),
                partial(peer.contact_page, "tag", tag),
            )
        )
    for status in ("granted", "denied"):
        note = ""
        if "consent" in contact_params:
            ours: Callable[[], Any] = partial(ours_contacts, consent=f"whatsapp:{status}")
        elif status == "granted":
            ours = partial(members_page, {"consent_required": "whatsapp"})
            note = "no consent filter: segment_members"
        else:
            continue
        reads.append(
            Read(
                f"contacts consent whatsapp={status}",
                ours,
                partial(peer.orm_contact_page, "consent", status),
                partial(peer.contact_page, "consent", status),
                note,
            )
        )
    for name, value in (("plan", "enterprise"), ("city", "Medellín")):
        note = ""
        if "attributes" in contact_params:
            ours = partial(ours_contacts, attributes={name: value})
        elif "attribute" in contact_params:
            ours = partial(ours_contacts, attribute=f"{name}={value}")
        else:
            ours = partial(members_page, {"attributes": {name: value}})
            note = "no attribute filter: segment_members"
        reads.append(
            Read(
                f"contacts attribute {name}={value}",
                ours,
                partial(peer.orm_contact_page, "attribute", {name: value}),
                partial(peer.contact_page, "attribute", {name: value}),
                note,
            )
        )
    # The searched contacts sit at fixed indices, so the rows line up across sizes.
    phone = phone_of(pick(size, lambda i: channel_of(i) == "whatsapp", 1007))
    email = email_of(pick(size, lambda i: email_of(i) is not None, 1511)) or ""
    for kind, q in (("name", "sofi"), ("name", "zora"), ("phone", phone), ("email", email)):
        reads.append(
            Read(
                f"contact_list q={q} ({kind})",
                partial(ours_contacts, q=q),
                partial(peer.orm_contact_page, kind, q),
                partial(peer.contact_page, kind, q),
            )
        )
    total = first_callable(crm, ("contact_count", "contact_total"))
    if total is not None:
        reads.append(
            Read(
                f"total contacts ({total.__name__})",
                partial(total, tenant),
                peer.orm_contact_total,
                peer.contact_total,
            )
        )
    else:
        reads.append(
            Read(
                "total contacts",
                lambda: sum(1 for _ in crm.contact_iter(tenant)),
                peer.orm_contact_total,
                peer.contact_total,
                "no count selector: contact_iter",
            )
        )
    for name in ("vip", "vip-pro-whatsapp"):
        rules = SEGMENTS[name]
        reads.append(
            Read(
                f"segment_count {name} ({len(rules)} rule{'s' if len(rules) > 1 else ''})",
                partial(crm.segment_count, tenant, spec.segments[name]),
                partial(peer.orm_segment_count, rules),
                partial(peer.segment_count, rules),
            )
        )
    preview_id, rules = spec.segments["vip-pro-whatsapp"], SEGMENTS["vip-pro-whatsapp"]
    reads.append(
        Read(
            "segment_preview vip-pro-whatsapp (count + 50)",
            lambda: preview_answer(crm.segment_preview(tenant, preview_id, limit=PAGE)),
            partial(peer.orm_segment_preview, rules),
            partial(peer.segment_preview, rules),
        )
    )
    reads.append(
        Read(
            f"segment_counts ({len(SEGMENTS)} segments)",
            lambda: dict(crm.segment_counts(tenant, crm.segment_list(tenant))),
            peer.orm_segment_counts,
            peer.segment_counts,
        )
    )

    # -- campaigns
    def ours_deliveries(state: str, reason: str | None) -> list[str]:
        page = campaign_selectors.delivery_list(tenant, spec.campaign_id, limit=PAGE, state=state, reason=reason)
        return [d.recipient for d in page.items]

    reads.append(
        Read(
            "campaign_progress (counts by state)",
            lambda: progress_answer(campaign_selectors.campaign_progress(tenant, spec.campaign_id).counts),
            peer.orm_progress,
            peer.progress,
        )
    )
    optin = SEGMENTS["whatsapp-optin"]
    reads.append(
        Read(
            "campaign_plan_of (a draft's preview: recipients)",
            lambda: campaign_selectors.campaign_plan_of(tenant, spec.campaign_id).counts.recipients,
            partial(peer.orm_segment_count, optin),
            partial(peer.segment_count, optin),
            "what a draft's page shows; this campaign is paused",
        )
    )
    for state, reason in (("failed", None), ("pending", None), ("dropped", "opted_out")):
        reads.append(
            Read(
                f"delivery_list state={state}" + (f" reason={reason}" if reason else ""),
                partial(ours_deliveries, state, reason),
                partial(peer.orm_delivery_page, state, reason),
                partial(peer.delivery_page, state, reason),
            )
        )
    if with_pages:
        reads += page_reads(spec)
    return reads


PAGES = (
    ("inbox/?view=mine", "inbox list, mine"),
    ("inbox/?view=unassigned&status=open", "inbox list, unassigned open"),
    ("crm/contacts/", "contacts"),
    ("crm/contacts/?q=zora", "contacts, search"),
    ("crm/contacts/?tag=embajador", "contacts, rare tag"),
    ("crm/segments/", "segments (a count each)"),
    ("campaigns/{campaign}/", "campaign (paused: progress, deliveries)"),
    ("", "tenant overview"),
)


def page_reads(spec: Spec) -> list[Read]:
    """Return the admin pages as reads: the server time of a GET by agent ana (Django's test client)."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    from botmesh_admin.tenancy.services import membership_set

    user, _ = get_user_model().objects.get_or_create(username=AGENT)
    membership_set(spec.tenant, username=AGENT, role="admin")
    client = Client()
    client.force_login(user)

    def get(url: str) -> int:
        response = client.get(url)
        if response.status_code != 200:
            raise RuntimeError(f"GET {url}: {response.status_code}")
        return 200

    out = []
    for path, label in PAGES:
        url = f"/t/{spec.tenant}/" + path.format(campaign=spec.campaign_id)
        out.append(
            Read(
                f"page: {label} (GET /t/…/{path.format(campaign='<id>')})",
                partial(get, url),
                None,
                None,
                "whole page, server side",
            )
        )
    return out


def normalize_counts(counts: Any) -> dict[str, int]:
    """Return a count selector's answer as ``{"<view>/<status or any>": n}`` (the peer's shape)."""
    if isinstance(counts, dict):
        out: dict[str, int] = {}
        for key, value in counts.items():
            if isinstance(value, dict):  # {view: {status: n}}: the peer also counts each view's total
                for status, n in value.items():
                    out[f"{key}/{status or 'any'}"] = int(n)
                if None not in value and "any" not in value:
                    out[f"{key}/any"] = sum(int(n) for n in value.values())
            elif isinstance(key, tuple):
                out[f"{key[0]}/{key[1] or 'any'}"] = int(value)
            else:
                out[str(key)] = int(value)
        return dict(sorted((k, v) for k, v in out.items() if v))
    return counts


def counts_by_paging(tenant: str) -> dict[str, int]:
    """Count every view × status in one pass over ``conversation_list`` (what a page could do today)."""
    from inbox import selectors as inbox

    groups: dict[tuple[str, str | None], int] = {}
    cursor = None
    while True:
        rows, cursor = inbox.conversation_list(tenant, agent=AGENT, limit=200, after=cursor)
        for r in rows:
            key = (r.status, r.conversation.assignee)
            groups[key] = groups.get(key, 0) + 1
        if cursor is None:
            break
    return Peer.view_counts([(s, a, n) for (s, a), n in groups.items()])


def preview_answer(preview: Any) -> tuple[int, list[str]]:
    return preview.count, [c.id for c in preview.sample]


def progress_answer(counts: Any) -> dict[str, Any]:
    return {
        "total": counts.total,
        "states": dict(sorted(counts.states.items())),
        "reasons": dict(sorted(counts.reasons.items())),
    }


# -- measuring -----------------------------------------------------------------------------------


@dataclass
class Result:
    """One read at one size: medians in ms (``None``: not run), Kv work per call, answers agreeing."""

    ours: float
    orm: float | None
    raw: float | None
    kv: dict[str, float]
    same: str | None  # agreement() with the peer's answer; None: no peer
    reps: int
    note: str = ""


def timed(fn: Callable[[], Any], reps: int, budget_s: float) -> tuple[float, Any, int]:
    """Return (median ms, answer, calls made): one warm-up, then ``reps`` calls within ``budget_s``.

    A fast read is repeated up to 4 × ``reps`` times while under a second has
    been spent: on a shared machine the median of a few millisecond-long calls
    moves with every burst of load.
    """
    began = time.perf_counter()
    answer = fn()
    first = time.perf_counter() - began
    if first > budget_s / 2:
        return first * 1000, answer, 1  # too slow to repeat: the warm-up is the measurement
    times: list[float] = []
    spent = first
    while (len(times) < reps and (spent < budget_s or not times)) or (spent < 1.0 and len(times) < 4 * reps):
        t = time.perf_counter()
        answer = fn()
        times.append(time.perf_counter() - t)
        spent += times[-1]
    return statistics.median(times) * 1000, answer, 1 + len(times)


def measure_one(read: Read, counting: CountingKv, reps: int, budget_s: float) -> Result | None:
    """Time one read on every side once (``timed``); ``None`` if ours raised (printed)."""
    from botmesh_admin.kv.runtime import use_kv

    with use_kv(counting):
        before = counting.snapshot()
        try:
            ours_ms, ours, n = timed(read.ours, reps, budget_s)
        except Exception as exc:  # a read that fails is reported, not fatal: the others still count
            print(f"  {read.name:<58} FAILED: {type(exc).__name__}: {exc}")
            return None
        after = counting.snapshot()
    kv = {k: (after.get(k, 0) - before.get(k, 0)) / n for k in after}
    orm_ms = raw_ms = None
    same: str | None = None
    if read.orm is not None:
        orm_ms, orm, _ = timed(read.orm, reps, budget_s)
    if read.raw is not None:
        raw_ms, raw, _ = timed(read.raw, reps, budget_s)
        same = agreement(ours, raw) if read.orm is None or orm == raw else "DIFFER"
        if same == "DIFFER":
            print(
                f"  ! {read.name}: answers differ\n    ours {short(ours)}\n    raw  {short(raw)}"
                + ("" if read.orm is None or orm == raw else f"\n    orm  {short(orm)}")
            )
    return Result(ours_ms, orm_ms, raw_ms, kv, same, max(1, n - 1), read.note)


def measure(reads: list[Read], counting: CountingKv, reps: int, budget_s: float, rounds: int) -> dict[str, Result]:
    """Measure every read ``rounds`` times over (passes over the whole list); keep each side's best.

    A burst of load from the machine's other users then costs a read one pass,
    not its number (the best of alternating rounds, as ``bench/ingest.py`` does).
    A read too slow to repeat (longer than half the budget) is measured once.
    """
    results: dict[str, Result] = {}
    for n in range(1, rounds + 1):
        print(f"  -- round {n} of {rounds}")
        for read in reads:
            if n > 1 and (read.name not in results or results[read.name].reps == 1):
                continue
            r = measure_one(read, counting, reps, budget_s)
            if r is None:
                continue
            best = results.setdefault(read.name, r)
            if best is not r:
                best.ours = min(best.ours, r.ours)
                best.orm = r.orm if best.orm is None or r.orm is None else min(best.orm, r.orm)
                best.raw = r.raw if best.raw is None or r.raw is None else min(best.raw, r.raw)
                best.same = best.same if best.same != "same" else r.same
            ratio = f"{r.ours / r.orm:7.1f}x" if r.orm else "      -"
            print(
                f"  {read.name:<58} ours {r.ours:9.1f} ms  orm {fmt(r.orm)}  raw {fmt(r.raw)}"
                f"  ours/orm {ratio}  kv {kv_text(r.kv)}" + ("" if r.same in (None, "same") else "  " + str(r.same))
            )
    return results


def agreement(ours: Any, peer: Any) -> str:
    """Return ``same``, ``short page (n of m)`` (ours stopped early, returning a cursor) or ``DIFFER``.

    A budgeted page (the CRM reads at most ``page_budget`` index entries per
    call) may hold fewer rows than the peer's; its rows must then be the first
    of the peer's page, in order.
    """
    if ours == peer:
        return "same"
    if isinstance(ours, list) and isinstance(peer, list) and len(ours) < len(peer) and peer[: len(ours)] == ours:
        return f"short page ({len(ours)} of {len(peer)})"
    return "DIFFER"


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 300 else text[:300] + "…"


def fmt(ms: float | None) -> str:
    return "        -" if ms is None else f"{ms:6.1f} ms"


def kv_text(kv: dict[str, float]) -> str:
    parts = [
        f"{name} {kv[name]:.0f}"
        for name in ("get", "get_many", "keys", "scan", "scan_follow", "scan_merge", "entries")
        if kv.get(name)
    ]
    return ", ".join(parts) or "-"


def size_label(n: int) -> str:
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}k" if n % 1000 == 0 else str(n)


def report(all_results: dict[int, dict[str, Result]], kv_url: str, builds: dict[int, str]) -> str:
    """Return the Markdown report: one row per read over the sizes, with the targets at the largest."""
    sizes = sorted(all_results)
    small, large = sizes[0], sizes[-1]
    names = list(dict.fromkeys(name for size in reversed(sizes) for name in all_results[size]))
    head = [
        "read",
        *(f"ours {size_label(s)}" for s in sizes),
        f"growth {size_label(small)}→{size_label(large)}",
        f"ORM {size_label(large)}",
        f"raw SQL {size_label(large)}",
        "ours/ORM",
        "ours/raw",
        f"Kv per call {size_label(large)}",
        f"Kv entries read per call, {size_label(small)} → {size_label(large)}",
        "targets",
    ]
    lines = [
        f"Kv: `{urlsplit(kv_url).scheme}`; peer: PostgreSQL (Django ORM over unmanaged models, and raw SQL "
        "through psycopg); times are medians in ms. Targets at the largest size: growth ≤ "
        f"{TARGET_GROWTH}×, ≤ {TARGET_ORM}× the ORM, ≤ {TARGET_MS:.0f} ms.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    passed = total = 0
    for name in names:
        cells = [name]
        for size in sizes:
            r = all_results[size].get(name)
            cells.append("-" if r is None else f"{r.ours:.1f}")
        present = [s for s in sizes if name in all_results[s]]
        a, b = all_results[present[0]][name], all_results[large].get(name)
        growth = b.ours / a.ours if b is not None and present[0] != large else None
        since = "" if present[0] == small else f" (from {size_label(present[0])})"
        cells.append("-" if growth is None else f"{growth:.2f}×{since}")
        cells += [
            "-" if b is None or b.orm is None else f"{b.orm:.1f}",
            "-" if b is None or b.raw is None else f"{b.raw:.1f}",
        ]
        versus = b.ours / b.orm if b and b.orm else None
        cells.append("-" if versus is None else f"{versus:.1f}×")
        cells.append("-" if b is None or not b.raw else f"{b.ours / b.raw:.1f}×")
        cells.append("-" if b is None else kv_text(b.kv))
        cells.append(
            "-" if b is None or present[0] == large else f"{a.kv.get('entries', 0):.0f} → {b.kv.get('entries', 0):.0f}"
        )
        verdicts = []
        if b is not None:
            checks = [
                ("growth", growth is None or growth <= TARGET_GROWTH),
                ("ORM", versus is None or versus <= TARGET_ORM),
                ("150 ms", b.ours <= TARGET_MS),
            ]
            failed = [label for label, ok in checks if not ok]
            verdicts.append("pass" if not failed else "FAIL " + ", ".join(failed))
            if b.same not in (None, "same"):
                verdicts.append(f"answer: {b.same}")
            if b.note:
                verdicts.append(b.note)
            passed += not failed
            total += 1
        cells.append("; ".join(verdicts))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"{passed} of {total} reads meet every target at {size_label(large)}."]
    lines += [
        "",
        "Builds: " + "; ".join(f"{size_label(s)}: {text}" for s, text in sorted(builds.items())),
    ]
    return "\n".join(lines)


# -- main ------------------------------------------------------------------------------------------


def check_indexes(tenant: str) -> None:
    """Run ``botmesh_check_indexes`` on the tenant (every declared index against its records)."""
    import io

    from django.core.management import call_command
    from django.core.management.base import CommandError

    out = io.StringIO()
    began = time.perf_counter()
    try:
        call_command("botmesh_check_indexes", tenant=tenant, stdout=out)
    except CommandError as exc:
        print(out.getvalue() + f"  index check: {exc}")
        raise SystemExit("the built tenant's indexes drift: the numbers would mean nothing") from None
    except Exception as exc:  # an installation without the command (before the index kernel)
        print(f"  index check skipped: {type(exc).__name__}: {exc}")
        return
    last = out.getvalue().strip().splitlines()[-1:] or [""]
    print(f"  {last[0]} ({time.perf_counter() - began:.0f} s)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000", help="comma-separated tenant sizes, ascending")
    parser.add_argument("--kv", help="Kv URL (default: the bench database on the test PostgreSQL server)")
    parser.add_argument("--tenant", help="tenant id (default: scale-<random>); reused if already built")
    parser.add_argument("--keep", action="store_true", help="keep the tenant for a later run")
    parser.add_argument("--drop", metavar="TENANT", help="drop a kept tenant and exit")
    parser.add_argument("--jobs", type=int, default=2, help="builder processes")
    parser.add_argument("--reps", type=int, default=5, help="timed calls per read (median)")
    parser.add_argument("--rounds", type=int, default=3, help="passes over every read; each side's best counts")
    parser.add_argument("--budget", type=float, default=20.0, help="seconds per read and side at most")
    parser.add_argument("--only", help="measure only reads whose name contains this text")
    parser.add_argument("--no-pages", action="store_true", help="skip the whole-page GETs")
    parser.add_argument(
        "--check-max",
        type=int,
        default=100_000,
        help="run botmesh_check_indexes on the tenant after building sizes up to this",
    )
    parser.add_argument("--out", help="report file name (default: scale_<kv>_<sizes>.md)")
    parser.add_argument(
        "--earlier",
        action="append",
        default=[],
        metavar="JSON",
        help="bench/results/scale_<tenant>.json of another tenant: its sizes below this tenant's"
        " size fill in the report (the same generator builds the same rows)",
    )
    parser.add_argument("--copy-to", action="append", default=[], metavar="DIR", help="also save the report here")
    args = parser.parse_args()
    server = os.environ.get("BOTMESH_TEST_POSTGRES_URL")
    if not server:
        print('BOTMESH_TEST_POSTGRES_URL is not set: run `eval "$(scripts/services.sh)"` first')
        return 2
    sizes = sorted(int(s) for s in args.sizes.split(","))
    db_url = ensure_database(server)
    kv_url = args.kv or db_url
    env = bench_env(db_url, kv_url)
    django_setup(env)
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    import psycopg

    from botmesh_admin.kv import connect

    pg = psycopg.connect(db_url, autocommit=True)
    for statement in STATE_DDL:
        pg.execute(statement)
    kv = connect(kv_url)
    if args.drop:
        drop_tenant(pg, kv, args.drop)
        return 0
    tenant = args.tenant or f"scale-{uuid.uuid4().hex[:8]}"
    spec = tenant_spec(pg, tenant, kv_url)
    print(
        f"tenant {tenant} on {urlsplit(kv_url).scheme} ({urlsplit(kv_url).path or '/'}), sizes "
        f"{', '.join(f'{s:,}' for s in sizes)}; peer tables {spec.prefix}*"
    )
    builder = Builder(kv, db_url)
    peer = Peer(spec, db_url)
    counting = counting_kv(kv)
    all_results: dict[int, dict[str, Result]] = {}
    builds: dict[int, str] = {}
    saved = ROOT / "bench" / "results" / f"scale_{tenant}.json"
    earlier = json.loads(saved.read_text()) if saved.exists() else {}
    for path in args.earlier:  # another tenant's sizes (the same generator: the same rows)
        for size, run in json.loads(Path(path).read_text()).items():
            if int(size) in sizes and int(size) < reach(pg, spec):
                earlier[size] = dict(run, commit=f"{run['commit']}, tenant {Path(path).stem[6:]}")
    try:
        for size in sizes:
            print(f"\n== {size:,} conversations and contacts")
            if size < reach(pg, spec):
                if str(size) in earlier:  # grown since: the numbers measured at that size stand
                    run = earlier[str(size)]
                    all_results[size] = {n: Result(**r) for n, r in run["results"].items()}
                    builds[size] = run["build"] + f" (measured at {run['commit']})"
                    print(f"  the tenant is bigger now: using the reads measured at {run['commit']}")
                else:
                    print("  the tenant is bigger now and nothing was measured at this size: skipped")
                continue
            seconds = build(spec, size, jobs=args.jobs, env=env, main_builder=builder)
            rss_mb = (
                max(
                    resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
                    resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                )
                / 1024
            )
            builds[size] = (
                (
                    f"{sum(seconds.values()):.0f} s ("
                    + ", ".join(f"{p} {s:.0f} s" for p, s in seconds.items())
                    + f"), peak builder RSS {rss_mb:.0f} MB"
                )
                if seconds
                else earlier.get(str(size), {}).get("build", "reused")
            )
            campaign_settle(spec, size)
            if seconds and size <= args.check_max:
                check_indexes(tenant)
            for name in PEER_COLUMNS:
                pg.execute(f"ANALYZE {spec.prefix}{name}")
            reads = build_reads(spec, peer, size, with_pages=not args.no_pages)
            if args.only:
                reads = [r for r in reads if args.only in r.name]
            all_results[size] = measure(reads, counting, args.reps, args.budget, args.rounds)
            earlier[str(size)] = {
                "commit": git_head(),
                "build": builds[size],
                "results": {n: r.__dict__ for n, r in all_results[size].items()},
            }
            saved.parent.mkdir(parents=True, exist_ok=True)
            saved.write_text(json.dumps(earlier, indent=1))
        text = report(all_results, kv_url, builds)
        print("\n" + text)
        name = args.out or f"scale_{urlsplit(kv_url).scheme}_{'-'.join(size_label(s) for s in sizes)}.md"
        title = f"# bench/scale.py — {datetime_now()} — commit {git_head()}\n\n"
        for directory in (ROOT / "bench" / "results", *map(Path, args.copy_to)):
            directory.mkdir(parents=True, exist_ok=True)
            (directory / name).write_text(title + text + "\n")
            print(f"saved {directory / name}")
    finally:
        if not args.keep:
            with contextlib.suppress(Exception):
                drop_tenant(pg, kv, tenant)
        else:
            print(
                f"kept tenant {tenant}: rerun with --tenant {tenant} (add --kv {kv_url} if not the default)"
                f", or drop it with --drop {tenant}"
            )
    return 0


def datetime_now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def git_head() -> str:
    """Return the commit this run started from (later commits during a long run do not relabel it)."""
    return _STARTED_AT


def _git_head_now() -> str:
    import subprocess

    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "?"


_STARTED_AT = _git_head_now()


if __name__ == "__main__":
    sys.exit(main())
