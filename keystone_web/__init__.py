"""Keystone's Django project (configuration only).

The Celery app (keystone_web/celery.py) is not imported here: a process imports it when it
first hands work on (evaluations.queue), so `keystone run`, `keystone validate` and the web
pages on the embedded default never pay for Celery. `celery -A keystone_web` finds
`keystone_web.celery` by itself."""
