"""WSGI entry point (gunicorn ``botmesh_admin.wsgi``)."""

import os

from botmesh_admin import config

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "botmesh_admin.settings")
config.load_or_exit()

from django.core.wsgi import get_wsgi_application  # noqa: E402

application = get_wsgi_application()

from botmesh_admin.httperrors import install_gunicorn_json_errors, install_runserver_json_errors  # noqa: E402

# gunicorn and the dev server refuse an over-long request line (414) or headers (431) themselves: in JSON,
# like the API (whichever of the two loaded this module).
install_gunicorn_json_errors()
install_runserver_json_errors()
