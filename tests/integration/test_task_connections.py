"""A task that fails — its time limit struck, perhaps inside a database command — leaves the worker no
connection to hand to its next task; one that succeeds keeps its connection for the next."""

from __future__ import annotations

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import task_failure, task_success
from django.db import connection

import llmgw.celery  # noqa: F401  (connects the app's signal receivers, as a worker's start does)

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_failed_tasks_connection_is_closed():
    connection.ensure_connection()
    assert connection.connection is not None
    task_failure.send(sender=None, task_id="t1", exception=SoftTimeLimitExceeded())
    assert connection.connection is None
    with connection.cursor() as cursor:  # the next task opens its own
        cursor.execute("select 1")
        assert cursor.fetchone() == (1,)


def test_a_successful_tasks_connection_is_kept():
    connection.ensure_connection()
    kept = connection.connection
    task_success.send(sender=None, result=None)
    assert connection.connection is kept
