from __future__ import annotations

from django.apps import AppConfig


class EvaluationsConfig(AppConfig):
    name = "evaluations"
    verbose_name = "Evaluations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the Celery tasks in every process, so evaluations.queue can send them
        # by name (eagerly, with no broker) without the services importing the tasks.
        from evaluations import tasks  # noqa: F401
