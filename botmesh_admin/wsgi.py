"""WSGI entry point (gunicorn ``botmesh_admin.wsgi``)."""

import os

from botmesh_admin import config

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "botmesh_admin.settings")
config.load_or_exit()

from django.core.wsgi import get_wsgi_application  # noqa: E402

application = get_wsgi_application()
