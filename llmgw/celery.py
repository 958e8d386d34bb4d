"""The Celery app: settings from Django's (CELERY_*), tasks found in the apps."""

import os

from celery import Celery
from celery.signals import task_failure

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")

app = Celery("llmgw")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@task_failure.connect
def _close_connections_after_a_failure(**_) -> None:
    """A task stopped by its time limit may have been stopped inside a database command. Its connection is
    closed, never handed to the worker's next task, which would fail with psycopg's "another command is
    already in progress" (seen on the conditions worker once evaluate_conditions ran past its soft limit)."""
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:  # an eager task inside a caller's transaction: the caller's to end
            conn.close()
