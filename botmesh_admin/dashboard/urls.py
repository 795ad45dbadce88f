"""Dashboard pages under ``/t/<tenant>/`` (replicas, jobs)."""

from __future__ import annotations

from django.urls import path

from . import views

app_name = "dashboard"

urlpatterns = [
    path("replicas/", views.replicas, name="replicas"),
    path("jobs/", views.jobs, name="jobs"),
    path("jobs/<str:job_id>/", views.job_edit, name="job-edit"),
]
