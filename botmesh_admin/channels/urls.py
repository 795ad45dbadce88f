"""``/webhooks/…`` — inbound webhooks of WhatsApp Cloud API and Telegram (root level, no session)."""

from django.urls import path

from . import views

app_name = "webhooks"
urlpatterns = [
    path("whatsapp/<str:tenant>", views.whatsapp_webhook, name="whatsapp"),
    path("telegram/<str:tenant>/<str:name>", views.telegram_webhook, name="telegram"),
]
