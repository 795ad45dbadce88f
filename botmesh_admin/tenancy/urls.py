from django.urls import path

from . import views

app_name = "tenancy"
urlpatterns = [
    path("tokens/", views.tokens, name="tokens"),
    path("tokens/<int:token_id>/revoke", views.token_revoke, name="token-revoke"),
    path("time-zone", views.time_zone, name="time-zone"),
    path("erase/", views.tenant_erase, name="erase"),
]
