"""A campaign's "the user blocked us" record is best effort: a CRM outage is logged and counted, the run goes on."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from botmesh_admin.channels.domain import OutboundMessage, SendResult
from botmesh_admin.channels.providers import TelegramProvider
from botmesh_admin.kv import connect
from botmesh_admin.observability import metrics
from botmesh_admin.observability.stores.memory import MemoryCounterStore
from campaigns import selectors, services
from campaigns.services.sending import CampaignBot, SendOptions
from campaigns.stores import CampaignStores
from campaigns.stores import use_store as use_campaign_store
from campaigns.stores.memory import MemoryCampaignStore, MemorySlotStore
from crm import services as crm
from crm.stores import use_store as use_contact_store
from crm.stores.kv import KvContactStore
from tests.faults.servers import Processes, RedisServer

from .conftest import make_contacts

FAST = SendOptions(batch_size=10, ttl_ms=5_000, rate_per_s=None, max_attempts=3)


class CrmDownAfterBroadcast:
    """The real Telegram provider; once its broadcast has answered, the CRM's Redis is SIGKILLed (an outage)."""

    def __init__(self, provider: TelegramProvider, crm_redis: RedisServer) -> None:
        self.provider, self.crm_redis = provider, crm_redis

    def broadcast(self, messages: Sequence[OutboundMessage]) -> list[SendResult]:
        results = self.provider.broadcast(messages)
        self.crm_redis.kill()
        return results

    def __getattr__(self, name: str) -> Any:
        return getattr(self.provider, name)


def test_a_crm_outage_while_recording_blocks_leaves_the_run_going(
    tenant_id: str, db, fake, tmp_path: Path, caplog
) -> None:
    from crm import selectors as crm_selectors

    crm_selectors._regions[tenant_id] = ("CO", float("inf"))
    with Processes(tmp_path) as procs:
        redis = procs.redis(appendonly=False)
        kv = connect(redis.url)
        try:
            with (
                use_contact_store(KvContactStore(kv)),
                use_campaign_store(CampaignStores(MemoryCampaignStore(), MemorySlotStore())),
            ):
                make_contacts(tenant_id, 3, channel="telegram")
                fake.script("700000001", "blocked")
                fake.script("700000002", "blocked")
                segment = crm.segment_create(tenant_id, name="Promo", rules={"tags_all": ["promo"]})
                campaign = services.campaign_create(
                    tenant_id,
                    name="Noviembre",
                    segment_id=segment.id,
                    channel="telegram",
                    message={"text": "Hola {name}, 20% hoy"},
                )
                services.campaign_start(tenant_id, campaign.id)
                provider = TelegramProvider(fake.base_url, "123456:" + "A" * 30, timeout_s=2, max_workers=4)
                bot = CampaignBot(CrmDownAfterBroadcast(provider, redis))  # type: ignore[arg-type]
                counters = MemoryCounterStore()
                with metrics.use_counter_store(counters), caplog.at_level(logging.WARNING, logger="botmesh.campaigns"):
                    done = services.campaign_run(tenant_id, campaign.id, bot=bot, options=FAST)
                    metrics.flush()
                assert done.state == "completed", done.error
                got = {d.recipient: d for d in selectors.delivery_list(tenant_id, campaign.id, limit=200).items}
                assert got["700000000"].state == "accepted"
                assert [(got[r].state, got[r].error_code) for r in ("700000001", "700000002")] == [("failed", 403)] * 2
                # Each block was tried and its failure logged (the first one's did not skip the second).
                lost = [r.getMessage() for r in caplog.records if "was not recorded in the CRM" in r.getMessage()]
                assert len(lost) == 2 and all("store_unavailable" in m for m in lost), lost
                assert not any("7000000" in m for m in lost), "no chat id in the log"
                assert counters.read().get("errors") == 2
        finally:
            kv.close()
            crm_selectors.tenant_region_forget(tenant_id)
