"""Celery tasks of the facility: thin, idempotent, state in the database."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="facility.tasks.history_record", ignore_result=True)
def history_record() -> None:
    """Write the minute's power history points, roll up quarters and prune (facility.history)."""
    from facility.history import history_record as record

    record()


@shared_task(name="facility.tasks.evaluate_conditions", ignore_result=True)
def evaluate_conditions() -> None:
    """Poll the facility sources and judge every domain's condition; a change asks for a reconcile."""
    from facility.evaluation import conditions_evaluate

    conditions_evaluate()
