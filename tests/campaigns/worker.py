"""A campaign sender run as a real process by the crash tests (SIGKILL, two at once, pause/resume).

``python -m tests.campaigns.worker '<json args>'``: runs ``services.campaign_run``
against the fake provider at ``base_url``, over the shared Kv at ``kv_url``
(``BOTMESH_KV_URL``), and calls it again while the campaign is ``running`` (as
the ``campaigns.tick`` job re-dispatches a stalled campaign). With
``journal_url`` it is a journal worker instead: an ``EventWorker`` on the
``campaigns-run`` channel of that journal, whose handler is the run event's
(``services.campaign_run_event``), claiming the run once no live lease holds it.
Prints ``STARTED`` and then ``DONE <state>`` (flushed); with ``wait_go`` it
waits for a line on stdin between the two.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(args: dict) -> None:
    os.environ["BOTMESH_KV_URL"] = args["kv_url"]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from botmesh_admin.channels.providers import TelegramProvider, WhatsAppProvider
    from campaigns import selectors, services
    from campaigns.services.sending import CampaignBot, SendOptions
    from crm import selectors as crm_selectors

    tenant, campaign_id = args["tenant"], args["campaign_id"]
    crm_selectors._regions[tenant] = ("CO", float("inf"))
    if args.get("channel", "whatsapp") == "whatsapp":
        provider = WhatsAppProvider(
            args["base_url"], "106540352242922", "test-token", timeout_s=5, max_workers=args.get("concurrency", 8)
        )
    else:
        provider = TelegramProvider(
            args["base_url"], "123456:" + "A" * 30, timeout_s=5, max_workers=args.get("concurrency", 8)
        )
    options = SendOptions(batch_size=args.get("batch", 25), ttl_ms=args["ttl_ms"], rate_per_s=args.get("rate"))
    print("STARTED", os.getpid(), flush=True)
    if args.get("wait_go"):
        sys.stdin.readline()  # started ahead of time (Django takes seconds to load): wait for the word
    deadline = time.monotonic() + args.get("max_s", 60)
    bot = CampaignBot(provider)
    if args.get("journal_url"):
        from botmesh_admin.events import connect_journal
        from botmesh_admin.events.base import EventRecord
        from botmesh_admin.events.worker import EventWorker
        from campaigns.domain import RUN_CHANNEL

        def handler(record: EventRecord) -> None:
            services.campaign_run_event(record, bot=bot, options=options)

        worker = EventWorker(connect_journal(args["journal_url"]), lease_ms=args["lease_ms"], channel=RUN_CHANNEL)
        while selectors.campaign_get(tenant, campaign_id).state == "running" and time.monotonic() < deadline:
            worker.run_batch(handler, limit=1)
            time.sleep(0.05)  # another worker's lease holds the run: claim it once that lease lapsed
    else:
        while True:
            campaign = services.campaign_run(tenant, campaign_id, bot=bot, options=options)
            if campaign.state != "running" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    print("DONE", selectors.campaign_get(tenant, campaign_id).state, flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
