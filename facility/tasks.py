"""Celery tasks of the facility: thin, idempotent, state in the database."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

log = logging.getLogger(__name__)

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


@shared_task(name="facility.tasks.netbox_sync", ignore_result=True, soft_time_limit=50, time_limit=60)
def netbox_sync() -> None:
    """Each minute: when server.yaml's facility.netbox.sync_every is due, claim the run and queue it (a read of
    NetBox may take minutes, longer than the minute between two of these)."""
    from django.utils import timezone

    from facility.netbox_sync import sync_claim

    if sync_claim(timezone.now()):
        netbox_sync_run.delay()


@shared_task(name="facility.tasks.netbox_sync_run", ignore_result=True, soft_time_limit=600, time_limit=660)
def netbox_sync_run() -> None:
    """The NetBox sync (facility.netbox_sync): what lowers a cap or adds an object is applied, the rest waits."""
    _sync_logged()


@shared_task(name="facility.tasks.netbox_import_run", ignore_result=True, soft_time_limit=600, time_limit=660)
def netbox_import_run(job_id: int) -> None:
    """A NetBox import or sync a person asked for (facility.import_jobs): its progress and end on its row."""
    from facility.import_jobs import import_job_run

    import_job_run(job_id=job_id)


def netbox_sync_tick() -> None:
    """The embedded server's minute: the claim and the run in its own thread."""
    from django.utils import timezone

    from facility.netbox_sync import sync_claim

    if sync_claim(timezone.now()):
        _sync_logged()


def _sync_logged() -> None:
    """The scheduled sync as a job of its own, run here (already off any request): its progress and end on
    its row, as a sync a person asked for."""
    from facility.import_jobs import scheduled_sync_run

    scheduled_sync_run()


# The single-flight flag of the feed-derived caps that nodes joining ask for (llmgw.coalesce).
FEED_CAPS_PENDING = "feed-caps"


@shared_task(name="facility.tasks.feed_caps_refresh", ignore_result=True, soft_time_limit=60, time_limit=90)
def feed_caps_refresh() -> None:
    """Rewrite the caps the feeds give (facility.feed_services.feed_caps_refresh); a change tells placement."""
    from facility.feed_services import _refresh_and_signal
    from llmgw.celery import app
    from llmgw.coalesce import pending_clear

    if not app.conf.task_always_eager:
        pending_clear(FEED_CAPS_PENDING)  # before it reads: a join committed after this asks again
    _refresh_and_signal()


def feed_caps_queue() -> None:
    """Ask for the feed-derived caps to be rewritten, once for a burst of joins, never in the request that
    asked: on workers one task pending at a time (llmgw.coalesce); in the embedded server its reconcile
    thread does it before its next round; elsewhere in-process (a command, a test), at once."""
    from kombu.exceptions import OperationalError as BrokerUnreachable

    from llmgw import inprocess
    from llmgw.celery import app
    from llmgw.coalesce import pending_claim, pending_clear

    if app.conf.task_always_eager:
        if inprocess.running():
            from facility.feed_services import _refresh_and_signal

            inprocess.ask(FEED_CAPS_PENDING, _refresh_and_signal)
        else:
            feed_caps_refresh()
        return
    claim = pending_claim(FEED_CAPS_PENDING)
    if claim is None:  # Redis did not answer the flag's read: the send would wait as long again
        log.warning("feed caps not queued (Redis did not answer); the next join or change asks again")
        return
    if not claim:
        return
    try:
        feed_caps_refresh.apply_async(expires=300)
    except BrokerUnreachable as exc:
        pending_clear(FEED_CAPS_PENDING)
        log.warning("feed caps not queued (%s); the next join or change asks again", exc)
