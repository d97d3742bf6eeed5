from __future__ import annotations

from django.apps import AppConfig


class EvaluationsConfig(AppConfig):
    name = "evaluations"
    verbose_name = "Evaluations"
    default_auto_field = "django.db.models.BigAutoField"

    # The Celery tasks are registered when evaluations.queue first sends one (and by the
    # Celery worker's autodiscovery), not here: most processes never send any.
