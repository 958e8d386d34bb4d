"""Celery tasks of placement: thin, idempotent, state in the database."""

from __future__ import annotations

import logging
import time

from celery import shared_task
from django.conf import settings
from django.db import DatabaseError, connection, transaction

from llmgw.coalesce import pending_claim, pending_clear
from llmgw.errors import is_write_conflict

log = logging.getLogger(__name__)


# A reconcile that loses a write conflict (a deadlock, a locked database) runs again at once, this often.
WRITE_CONFLICT_TRIES = 3

# pg_try_advisory_lock key of the reconcile: one at a time across every worker.
RECONCILE_LOCK = 0x6C6C6D67  # "llmg"


# The single-flight flag of the reconciles changes ask for (llmgw.coalesce).
RECONCILE_PENDING = "reconcile"

# A reconcile ends before the next beat's: one that would overrun is cut, and the next takes it up.
RECONCILE_SOFT_LIMIT = settings.RECONCILE_INTERVAL_SECONDS * 0.9


@shared_task(name="placement.tasks.reconcile", acks_late=True, ignore_result=True,
             soft_time_limit=RECONCILE_SOFT_LIMIT, time_limit=settings.RECONCILE_INTERVAL_SECONDS)
def reconcile() -> None:
    """Bring every model to its desired replicas (and move what drains); safe to run any time, twice.

    On workers one runs at a time (single-flight): a reconcile asked for while another runs is tried
    again two seconds later, so what changed meanwhile is not left for the next beat; of those, one
    waits at a time. A round works only on the models whose inputs moved (placement.reconcile).
    """
    from llmgw.celery import app
    from placement.reconcile import reconcile_all

    if app.conf.task_always_eager or connection.vendor != "postgresql":
        _with_retries(reconcile_all)
        return
    # Before anything is read: a change committed after this asks for the next one (llmgw.coalesce).
    pending_clear(RECONCILE_PENDING)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [RECONCILE_LOCK])
        if not cursor.fetchone()[0]:
            if pending_claim(RECONCILE_PENDING):  # one waits behind the running one, never a queue of them
                reconcile_queue(countdown=2, expires=60)
            return
    try:
        _with_retries(reconcile_all)
    except DatabaseError as exc:
        if not is_write_conflict(exc):
            raise
        log.warning("reconcile lost a write conflict %d times; tried again in 1 s", WRITE_CONFLICT_TRIES)
        reconcile.apply_async(countdown=1, expires=60)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [RECONCILE_LOCK])


def _with_retries(run) -> None:
    """Run, and run again (up to WRITE_CONFLICT_TRIES in all) when another writer was in the way."""
    for attempt in range(1, WRITE_CONFLICT_TRIES + 1):
        try:
            run()
            return
        except DatabaseError as exc:
            if attempt == WRITE_CONFLICT_TRIES or not is_write_conflict(exc):
                raise
            log.info("reconcile met a write conflict (%s); trying again", exc)
            time.sleep(0.05 * attempt)


def _enqueue() -> None:
    from llmgw.celery import app

    if app.conf.task_always_eager:
        # In-process (no Redis): the change that asked is committed already, so a reconcile that fails
        # must not look like its failure; the periodic reconcile tries again. It runs inside the request
        # that asked, so its placements are bounded: the rest wait for the reconcile thread.
        from llmgw import inprocess
        from placement.reconcile import REQUEST_PLACEMENTS, reconcile_all

        try:
            run = reconcile_all(max_placements=REQUEST_PLACEMENTS)
        except Exception:
            log.exception("reconcile failed; it is retried on the next periodic run")
            return
        if run.unfinished:
            inprocess.wake()
        return
    # Coalesced: while one reconcile is pending, asking again sends nothing (it reads every change made
    # before it starts). A burst of nodes joining queues one reconcile, not one per node.
    claim = pending_claim(RECONCILE_PENDING)
    if claim is None:  # Redis did not answer the flag's read: a send would wait as long again
        from llmgw.dependencies import task_not_queued

        task_not_queued("reconcile", "Redis did not answer")
    elif claim:
        reconcile_queue(expires=300)


def reconcile_queue(**options) -> bool:
    """Send a reconcile to the workers (apply_async's `options`); whether it was sent. With Redis out of
    reach the send fails within LLMGW_REDIS_TIMEOUT, and that is said in the answer of the request that
    asked rather than raised: the change is stored already, and beat's reconcile takes it up once Redis
    is back."""
    from kombu.exceptions import OperationalError as BrokerUnreachable

    from llmgw.dependencies import task_not_queued

    try:
        reconcile.apply_async(**options)
    except BrokerUnreachable as exc:
        pending_clear(RECONCILE_PENDING)
        task_not_queued("reconcile", exc)
        return False
    return True


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
        transaction.on_commit(lambda: reconcile_queue(countdown=seconds, expires=seconds + 60))
