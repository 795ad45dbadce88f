"""CRM pages under ``/t/<tenant>/crm/``."""

from django.urls import path
from django.views.generic import RedirectView

from . import views

app_name = "crm"
urlpatterns = [
    path("", RedirectView.as_view(pattern_name="crm:contacts"), name="home"),
    path("contacts/", views.contacts, name="contacts"),
    path("contacts/import/", views.contact_import, name="import"),
    path("contacts/import/<str:job_id>/", views.import_job, name="import-job"),
    path("contacts/export.csv", views.contact_export, name="export"),
    path("contacts/<str:contact_id>/", views.contact_detail, name="contact"),
    path("contacts/<str:contact_id>/edit", views.contact_edit, name="contact-edit"),
    path("contacts/<str:contact_id>/tags", views.contact_tags, name="contact-tags"),
    path("contacts/<str:contact_id>/consent", views.contact_consent, name="contact-consent"),
    path("contacts/<str:contact_id>/erase", views.contact_erase, name="contact-erase"),
    path("segments/", views.segments, name="segments"),
    path("segments/preview", views.segment_preview, name="segment-preview"),
    path("segments/<str:segment_id>/", views.segment_detail, name="segment"),
    path("segments/<str:segment_id>/delete", views.segment_delete, name="segment-delete"),
]
