"""The tenant overview: one card per package with the number its users look at first."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from django.urls import NoReverseMatch, reverse

from botmesh_admin.tenancy.principal import Principal

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Card:
    """One overview tile: ``value`` is the headline number, ``detail`` one line under it."""

    title: str
    value: str
    detail: str
    url: str | None
    tone: str = ""  # "", "ok", "warn" or "bad" (the pill colours of app.css)


def _inbox(tenant: str, p: Principal) -> Card:
    from inbox import selectors

    agent = p.actor.split(":", 1)[1]
    unread = selectors.unread_total(tenant, agent=agent)  # both are O(1) count reads
    waiting = selectors.conversation_count(tenant, agent=agent, view="unassigned", status="open")
    return Card(
        "Inbox",
        str(unread),
        f"unread for you · {waiting} open and unassigned",
        "inbox:list",
        "warn" if waiting else "ok",
    )


def _contacts(tenant: str, p: Principal) -> Card:
    from crm import selectors

    total = selectors.contact_count(tenant)  # one counter read, not a scan of the tenant
    segments = selectors.segment_list(tenant)
    return Card("Contacts", str(total), f"{len(segments)} saved segments", "crm:contacts")


def _campaigns(tenant: str, p: Principal) -> Card:
    from campaigns import selectors

    page = selectors.campaign_list(tenant, limit=200)
    running = sum(1 for c in page.items if c.state == "running")
    scheduled = sum(1 for c in page.items if c.state == "scheduled")
    return Card(
        "Campaigns",
        str(running),
        f"running · {scheduled} scheduled · {len(page.items)} in all",
        "campaigns:list",
        "ok" if running else "",
    )


def _plugins(tenant: str, p: Principal) -> Card:
    from hub import selectors

    counts = selectors.plugin_counts(tenant)
    return Card("Plugins", f"{counts.enabled}/{counts.installed}", "enabled / installed", "hub:plugins")


def _deployments(tenant: str, p: Principal) -> Card:
    from deployments import selectors

    count = selectors.deployment_active_count(tenant)
    live = [f"{a.bot} {a.version}" for a in selectors.deployment_active_list(tenant, limit=200)]
    return Card(
        "Deployments", str(count), ", ".join(live) or "nothing live", "deployments:bots", "ok" if live else "warn"
    )


def _journal(tenant: str, p: Principal) -> Card:
    from botmesh_admin.events.selectors import event_summary

    summary = event_summary(tenant)
    dead = summary.by_state.get("dead", 0)
    pending = summary.by_state.get("pending", 0) + summary.by_state.get("leased", 0)
    letters = "dead letter" if dead == 1 else "dead letters"  # the card's value is the count
    events = _plural(summary.total, "event")
    return Card(
        "Journal",
        str(dead),
        f"{letters} · {pending} waiting · {events}",
        "events:list",
        "bad" if dead else "ok",
    )


def _plural(n: int, noun: str) -> str:
    """Return ``"1 dead letter"``, ``"2 dead letters"``, ``"0 events"``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


CARDS: list[tuple[str, Callable[[str, Principal], Card]]] = [
    ("agent", _inbox),
    ("agent", _contacts),
    ("admin", _campaigns),
    ("admin", _plugins),
    ("admin", _deployments),
    ("admin", _journal),
]


def tenant_overview(tenant: str, *, principal: Principal) -> list[Card]:
    """Return the cards ``principal`` may see. A card whose source fails says so instead of failing the page."""
    cards: list[Card] = []
    for role, build in CARDS:
        if not principal.can(role):
            continue
        try:
            card = build(tenant, principal)
        except Exception:
            logger.exception("overview card %s failed for tenant %s", build.__name__, tenant)
            card = Card(build.__name__.strip("_").title(), "—", "unavailable right now (see the logs)", None, "bad")
        try:
            url = reverse(card.url, kwargs={"tenant": tenant}) if card.url else None
        except NoReverseMatch:
            url = None
        cards.append(Card(card.title, card.value, card.detail, url, card.tone))
    return cards
