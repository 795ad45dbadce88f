"""Admin pages of the inbox, under ``/t/<tenant>/inbox/``."""

from django.urls import path

from . import views

app_name = "inbox"
urlpatterns = [
    path("", views.inbox_list, name="list"),
    path("_list", views.list_fragment, name="list-fragment"),
    path("<str:conversation_id>/", views.conversation, name="conversation"),
    path("<str:conversation_id>/_thread", views.thread_fragment, name="thread-fragment"),
    path("<str:conversation_id>/assign", views.assign, name="assign"),
    path("<str:conversation_id>/handoff", views.handoff, name="handoff"),
    path("<str:conversation_id>/status", views.status, name="status"),
    path("<str:conversation_id>/note", views.note, name="note"),
    path("<str:conversation_id>/reply", views.reply, name="reply"),
    path("<str:conversation_id>/resend", views.resend, name="resend"),
    path("<str:conversation_id>/erase", views.erase, name="erase"),
]
