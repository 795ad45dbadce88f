"""``/webhooks/…`` — inbound webhooks of WhatsApp Cloud API and Telegram (root level, no session)."""

from django.urls import path

from . import webhooks

app_name = "webhooks"
urlpatterns = [
    path("whatsapp/<str:tenant>", webhooks.whatsapp_webhook, name="whatsapp"),
    path("telegram/<str:tenant>/<str:name>", webhooks.telegram_webhook, name="telegram"),
]
