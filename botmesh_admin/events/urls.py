"""Journal pages under ``/t/<tenant>/journal/``."""

from __future__ import annotations

from django.urls import path

from . import views

app_name = "events"

urlpatterns = [
    path("", views.journal, name="list"),
    path("table", views.journal_table, name="table"),
    path("<str:event_id>/", views.event_detail, name="detail"),
    path("<str:event_id>/replay", views.event_replay, name="replay"),
]
