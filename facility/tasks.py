"""Celery tasks of the facility: thin, idempotent, state in the database."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="facility.tasks.history_record", ignore_result=True)
def history_record() -> None:
    """Write the minute's power history points, roll up quarters and prune (facility.history)."""
    from facility.history import history_record as record

    record()
