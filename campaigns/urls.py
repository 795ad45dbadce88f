"""Campaign pages under ``/t/<tenant>/campaigns/``."""

from django.urls import path

from . import views

app_name = "campaigns"
urlpatterns = [
    path("", views.campaign_list, name="list"),
    path("new/", views.campaign_editor, name="new"),
    path("preview", views.campaign_preview, name="preview"),
    path("<str:campaign_id>/", views.campaign_detail, name="detail"),
    path("<str:campaign_id>/edit/", views.campaign_editor, name="edit"),
    path("<str:campaign_id>/deliveries", views.delivery_table, name="deliveries"),
    path("<str:campaign_id>/<str:action>", views.campaign_action, name="action"),
]
