"""Admin pages of the hub, under ``/t/<tenant>/plugins/``."""

from django.urls import path

from . import views

app_name = "hub"
urlpatterns = [
    path("", views.plugins, name="plugins"),
    path("install", views.install, name="install"),
    path("audit", views.audit, name="audit"),
    path("<str:plugin_id>/", views.plugin, name="plugin"),
    path("<str:plugin_id>/grant", views.grant, name="grant"),
    path("<str:plugin_id>/revoke", views.revoke, name="revoke"),
    path("<str:plugin_id>/enable", views.enable, name="enable"),
    path("<str:plugin_id>/disable", views.disable, name="disable"),
    path("<str:plugin_id>/uninstall", views.uninstall, name="uninstall"),
]
