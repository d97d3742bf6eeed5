"""The Celery application. Configuration is read from Django settings (CELERY_* names).

With no CELERY_BROKER_URL the settings turn on CELERY_TASK_ALWAYS_EAGER, so `.delay()`
runs the task in the calling process: the embedded default needs no broker.
"""

from __future__ import annotations

import gc
import os

from celery import Celery
from celery.signals import task_postrun, task_prerun, worker_init
from django.db import close_old_connections

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "keystone_web.settings")
# A worker serves no page: Celery's Django fix-up would run Django's system checks at its
# start, whose URL check imports the whole web application (the URLconf, every view, the
# REST API with pydantic: 200 modules, ~15 MB in the worker and, after the fork, in its
# pool's shared pages; issue 18). The web server and `manage.py check` run them.
os.environ.setdefault("CELERY_SKIP_CHECKS", "1")

app = Celery("keystone_web")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Finds `tasks.py` in every installed app (evaluations/tasks.py).
app.autodiscover_tasks()


@worker_init.connect
def _import_what_executions_need(**_: object) -> None:
    """Imported once in the worker's main process, before its pool forks: the pool's
    children share these pages instead of each importing (and holding) its own copy, as
    they did at their first execution."""
    from evaluations.services.executions import execution_modules_import

    execution_modules_import()

    # Out of the collector's sight (after collecting what is garbage already): a collection
    # in a child writes to every object it examines, which copied the shared pages into
    # each child.
    gc.collect()
    gc.freeze()


def _close_old_connections(sender: object = None, **_: object) -> None:
    """A task's database connections live as a request's do (settings.CELERY_DB_REUSE_MAX):
    dropped before and after it when unusable or older than their CONN_MAX_AGE, and checked
    before their first use when CONN_HEALTH_CHECKS is on (a database server restarted
    meanwhile). Not around a task run eagerly: that one is inside its caller's work."""
    if not getattr(getattr(sender, "request", None), "is_eager", False):
        close_old_connections()


task_prerun.connect(_close_old_connections)
task_postrun.connect(_close_old_connections)
