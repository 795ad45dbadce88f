"""Celery app of the SIGTERM drain test: botmesh_admin's app plus one task that runs a campaign.

``celery -A tests.campaigns.drain_app worker``. ``tests.campaigns.drain_run``
does what ``campaigns.run`` does (``tasks.run_or_requeue``: run, and requeue
the run a shutdown stopped) with the bot pointed at the test's fake provider
(``base_url``) instead of the tenant's channel configuration.
"""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "botmesh_admin.settings")
django.setup()

from celery import Task  # noqa: E402

from botmesh_admin.celery import app  # noqa: E402

BATCH = 10


@app.task(bind=True, name="tests.campaigns.drain_run", acks_late=True, ignore_result=True, max_retries=None)
def drain_run(self: Task, tenant: str, campaign_id: str, base_url: str) -> str:
    """Send the campaign through the fake provider at ``base_url``, ``BATCH`` requests at once."""
    from botmesh_admin.channels.providers import WhatsAppProvider
    from campaigns import tasks
    from campaigns.services.sending import CampaignBot, SendOptions
    from crm import selectors as crm_selectors

    crm_selectors._regions[tenant] = ("CO", float("inf"))
    provider = WhatsAppProvider(base_url, "106540352242922", "test-token", timeout_s=15, max_workers=BATCH)
    options = SendOptions(batch_size=BATCH, ttl_ms=30_000)
    return tasks.run_or_requeue(self, tenant, campaign_id, bot=CampaignBot(provider), options=options)
