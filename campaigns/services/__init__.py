"""Campaign writes (STYLE §9), one module per seam; ``from campaigns.services import <action>`` keeps working.

- ``definition``: create, edit, delete, start / schedule, pause, resume, cancel, resend;
- ``planning``: who gets a campaign (``Planner``) and a run's fixed recipients;
- ``sending``: the batched, rate-limited send of a run's open slots;
- ``running``: the run (``campaign_run``) and the scheduler's tick.
"""

from .definition import (
    campaign_cancel,
    campaign_create,
    campaign_delete,
    campaign_pause,
    campaign_resume,
    campaign_run_dead_lettered,
    campaign_run_dispatch,
    campaign_start,
    campaign_update,
    delivery_resend,
    validate_segment,
)
from .running import bot_for, campaign_run, campaign_run_event, campaign_start_due, campaigns_tick, default_options

__all__ = [
    "bot_for",
    "campaign_cancel",
    "campaign_create",
    "campaign_delete",
    "campaign_pause",
    "campaign_resume",
    "campaign_run",
    "campaign_run_dead_lettered",
    "campaign_run_dispatch",
    "campaign_run_event",
    "campaign_start",
    "campaign_start_due",
    "campaign_update",
    "campaigns_tick",
    "validate_segment",
    "default_options",
    "delivery_resend",
]
