"""Celery tasks of the facility: thin, idempotent, state in the database."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

# Each periodic task ends before its next run: a round that would overrun is cut (the next one starts
# afresh; the state is in the database).
HISTORY_SOFT_LIMIT = settings.HISTORY_INTERVAL_SECONDS * 0.9
CONDITIONS_SOFT_LIMIT = settings.CONDITIONS_INTERVAL_SECONDS * 0.9


@shared_task(name="facility.tasks.history_record", ignore_result=True, soft_time_limit=HISTORY_SOFT_LIMIT,
             time_limit=settings.HISTORY_INTERVAL_SECONDS)
def history_record() -> None:
    """Write the minute's power history points, roll up quarters and prune (facility.history)."""
    from facility.history import history_record as record

    record()


@shared_task(name="facility.tasks.evaluate_conditions", ignore_result=True,
             soft_time_limit=CONDITIONS_SOFT_LIMIT, time_limit=settings.CONDITIONS_INTERVAL_SECONDS)
def evaluate_conditions() -> None:
    """Poll the facility sources and judge every domain's condition; a change asks for a reconcile."""
    from facility.evaluation import conditions_evaluate

    conditions_evaluate()


@shared_task(name="facility.tasks.netbox_sync", ignore_result=True, soft_time_limit=600, time_limit=660)
def netbox_sync() -> None:
    """The scheduled NetBox sync (facility.netbox_sync), when server.yaml's facility.netbox.sync_every is due:
    what lowers a cap or adds an object is applied, the rest waits for a person."""
    netbox_sync_tick()


def netbox_sync_tick() -> None:
    from django.utils import timezone

    from facility.netbox_sync import netbox_sync as sync
    from facility.netbox_sync import sync_due
    from llmgw.errors import InvalidInput

    if not sync_due(timezone.now()):
        return
    try:
        sync()
    except InvalidInput as exc:  # recorded on the site's row, shown by ctl facility import status
        import logging

        logging.getLogger("llmgw.netbox").warning("NetBox sync failed: %s", exc.message)
