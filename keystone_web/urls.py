"""Top-level URLs: admin, auth, the API, and the evaluations pages."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from keystone_web.api import api

admin.autodiscover()  # the apps' admin.py (settings: SimpleAdminConfig)

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/", api.urls),
    path("", include("evaluations.urls")),
]
