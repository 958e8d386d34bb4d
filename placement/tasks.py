"""Celery tasks of placement: thin, idempotent, state in the database."""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import transaction

log = logging.getLogger(__name__)


@shared_task(name="placement.tasks.reconcile", acks_late=True, ignore_result=True)
def reconcile() -> None:
    """Bring every model to its desired replicas (and move what drains); safe to run any time, twice."""
    from placement.services import reconcile_all

    reconcile_all()


def _enqueue() -> None:
    from llmgw.celery import app

    if app.conf.task_always_eager:
        # In-process (no Redis): the change that asked is committed already, so a reconcile that fails
        # must not look like its failure; the periodic reconcile tries again.
        try:
            reconcile()
        except Exception:
            log.exception("reconcile failed; it is retried on the next periodic run")
        return
    reconcile.apply_async(expires=300)


def request_reconcile() -> None:
    """Ask for a reconcile once the current transaction commits (in-process without Redis).

    Several changes in one transaction ask once: the reconcile reads everything anyway.
    """
    connection = transaction.get_connection()
    if connection.in_atomic_block and any(entry[1] is _enqueue for entry in connection.run_on_commit):
        return
    transaction.on_commit(_enqueue)


def reconcile_after(seconds: float) -> None:
    """Ask for a reconcile in `seconds` (on workers); in-process, the periodic reconcile covers it."""
    from llmgw.celery import app

    if not app.conf.task_always_eager:
        transaction.on_commit(lambda: reconcile.apply_async(countdown=seconds, expires=seconds + 60))
