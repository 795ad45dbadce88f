"""Celery app of the SIGTERM drain test: botmesh_admin's app, its campaign runs sent to the test's fake provider.

``celery -A tests.campaigns.drain_app worker``. A run is the ``campaigns.run``
journal event, drained by ``events.drain``; here its handler is what
``campaigns.handlers`` registers (``services.campaign_run_event``: run, and
publish the successor of a run a shutdown stopped) with the bot pointed at the
fake provider (``DRAIN_PROVIDER_URL``) instead of the tenant's channel configuration.
"""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "botmesh_admin.settings")
django.setup()

from celery.signals import worker_init  # noqa: E402

from botmesh_admin.celery import app  # noqa: E402,F401
from botmesh_admin.events.base import EventRecord  # noqa: E402

BATCH = 10


def drain_run(record: EventRecord) -> None:
    """Send the campaign through the fake provider at ``DRAIN_PROVIDER_URL``, ``BATCH`` requests at once."""
    from botmesh_admin.channels.providers import WhatsAppProvider
    from campaigns.services import campaign_run_event
    from campaigns.services.sending import CampaignBot, SendOptions
    from crm import selectors as crm_selectors

    crm_selectors._regions[record.tenant] = ("CO", float("inf"))
    provider = WhatsAppProvider(
        os.environ["DRAIN_PROVIDER_URL"], "106540352242922", "test-token", timeout_s=15, max_workers=BATCH
    )
    campaign_run_event(record, bot=CampaignBot(provider), options=SendOptions(batch_size=BATCH, ttl_ms=30_000))


@worker_init.connect
def _use_fake_provider(**kwargs: object) -> None:
    # In the worker only (the test imports BATCH from here): campaigns' handler first, then this one in its place.
    from botmesh_admin.events import handlers
    from campaigns import handlers as campaign_handlers  # noqa: F401
    from campaigns.domain import RUN_EVENT

    handlers.unregister(RUN_EVENT)
    handlers.register(RUN_EVENT)(drain_run)
