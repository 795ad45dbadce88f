"""Root-level routes: ``/metrics`` (Prometheus) and the tenant metrics and traces pages."""

from django.urls import path

from . import views

app_name = "observability"
urlpatterns = [
    path("metrics", views.prometheus_metrics, name="prometheus"),
    path("t/<str:tenant>/metrics/", views.metrics_page, name="metrics"),
    path("t/<str:tenant>/traces/", views.traces_page, name="traces"),
    path("t/<str:tenant>/traces/message/", views.message_trace, name="message-trace"),
    path("t/<str:tenant>/traces/<str:trace_id>/", views.trace_page, name="trace"),
]
