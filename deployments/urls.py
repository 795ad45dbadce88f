"""Admin pages of deployments, under ``/t/<tenant>/deployments/``."""

from django.urls import path

from . import views

app_name = "deployments"
urlpatterns = [
    path("", views.bots, name="bots"),
    path("<str:bot>/", views.bot, name="bot"),
    path("<str:bot>/audit", views.audit, name="audit"),
    path("<str:bot>/versions/<str:version>/gates/<str:gate>/decision", views.gate_decide, name="gate-decide"),
    path("<str:bot>/confirm/<str:action>/<str:version>", views.confirm, name="confirm"),
]
