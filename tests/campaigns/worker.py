"""A campaign sender run as a real process by the crash tests (SIGKILL, two at once, pause/resume).

``python -m tests.campaigns.worker '<json args>'``: runs ``services.campaign_run``
— what the ``campaigns.run`` Celery task calls — against the fake provider at
``base_url``, over the shared Kv at ``kv_url`` (``BOTMESH_KV_URL``), and calls it
again while the campaign is ``running`` but another runner holds its lease
(as the ``campaigns.tick`` job re-dispatches a stalled campaign). Prints
``STARTED`` and then ``DONE <state>`` (flushed); with ``wait_go`` it waits for a
line on stdin between the two.
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
    from django.test import override_settings

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
    with override_settings(BOTMESH_CAMPAIGN_LEASE_MS=args["lease_ms"]):
        while True:
            campaign = services.campaign_run(
                tenant, campaign_id, bot=CampaignBot(provider), options=options, use_lease=args.get("use_lease", True)
            )
            if campaign.state != "running" or time.monotonic() > deadline:
                break
            time.sleep(0.1)  # another runner holds the lease: try again once it may have expired
    print("DONE", selectors.campaign_get(tenant, campaign_id).state, flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
