"""ASGI entry point."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

from keystone_web.serving import app_loaded

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "keystone_web.settings")

application = get_asgi_application()
app_loaded()
