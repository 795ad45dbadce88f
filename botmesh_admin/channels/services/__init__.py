"""Writes of the channels app: configuration (``config``) and webhook acceptance (``webhooks``).

``from botmesh_admin.channels.services import <action>`` is the public surface.
"""

from .config import (
    channel_config_delete,
    channel_config_set,
    channel_credentials_rotate,
    validate_api_base_url,
)
from .webhooks import (
    WebhookAccepted,
    WebhookRefused,
    webhook_telegram_accept,
    webhook_whatsapp_accept,
    webhook_whatsapp_handshake,
)

__all__ = [
    "WebhookAccepted",
    "WebhookRefused",
    "channel_config_delete",
    "channel_config_set",
    "channel_credentials_rotate",
    "validate_api_base_url",
    "webhook_telegram_accept",
    "webhook_whatsapp_accept",
    "webhook_whatsapp_handshake",
]
