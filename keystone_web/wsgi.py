"""WSGI entry point (gunicorn keystone_web.wsgi)."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

from keystone_web.serving import app_loaded

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "keystone_web.settings")

application = get_wsgi_application()
app_loaded()
