"""NetBox imports as jobs: asked for by the API, ctl or the schedule, run off the request that asked.

Reading NetBox may take minutes (facility.netbox_import.NETBOX_TOTAL_SECONDS), so no web request waits
for it: the request writes an :class:`~facility.models.ImportJob` and answers 202 with its id. A worker
runs it (the embedded server: a thread of its own; a command or a test without a server: at once, before
it returns), holding no database connection while NetBox answers — each progress write takes one and
gives it back. The job's row says where it is (its phase, the objects read, the changes applied) and how
it ended (the import's diff, or the reason it failed); ctl and the Facility page read it there.

A dry run and ``confirm`` (ctl's ``--yes``) mean what they mean for a direct import: the job's result is
the same diff, with what was held back for a person.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from django.db import close_old_connections, connection, transaction
from django.utils import timezone

from facility.import_progress import job_progress_text
from facility.models import ImportJob
from llmgw.errors import Conflict, LlmgwError, NotFound

log = logging.getLogger("llmgw.netbox")

# Jobs queued or running at once: past it a new one is refused, naming them (each may read NetBox for
# minutes; fifteen trickling NetBoxes must not take every worker).
MAX_ACTIVE = 4
# Rows kept: past it, the oldest ended jobs go.
KEEP = 200
# A job queued or running this long lost its worker (a run's hard limit is 660 s): it is failed, saying so.
LOST_SECONDS = 15 * 60
# The objects read are written at most this often (a phase that changes, at once).
PROGRESS_SECONDS = 1.0
ACTIVE = (ImportJob.State.QUEUED, ImportJob.State.RUNNING)
ENDED = (ImportJob.State.DONE, ImportJob.State.FAILED)

# The embedded server's import thread: jobs run one after another, never in a request's thread.
_embedded = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmgw-import")


def import_job_create(
    *, kind: str = ImportJob.Kind.IMPORT, url: str = "", token: str = "", site: str | None = None,
    options: dict[str, Any] | None = None, dry_run: bool = False, confirm: bool = False, requested_by: str = "",
) -> ImportJob:
    """Write a job and queue it (on commit). Conflict while MAX_ACTIVE jobs are queued or running."""
    jobs_lost_fail()
    active = list(ImportJob.objects.filter(state__in=ACTIVE).order_by("id").values_list("id", flat=True))
    if len(active) >= MAX_ACTIVE:
        ids = ", ".join(str(i) for i in active)
        raise Conflict(
            f"netbox: {len(active)} imports are queued or running (jobs {ids}), at most {MAX_ACTIVE}; wait for one "
            f"to end (llmgw ctl facility import job {active[0]})", field="netbox",
        )
    job = ImportJob.objects.create(
        kind=kind, url=url, token=token, site=site or "", options=options or {}, dry_run=dry_run, confirm=confirm,
        requested_by=requested_by[:150],
    )
    _prune()
    _queue(job.pk)
    return job


def scheduled_sync_run() -> None:
    """The scheduled sync (facility.netbox_sync) as a job of its own, run here, already off any request: its
    progress and end on its row, as a sync a person asked for."""
    job = ImportJob.objects.create(kind=ImportJob.Kind.SYNC, requested_by="schedule")
    _prune()
    import_job_run(job_id=job.pk)
    job.refresh_from_db()
    if job.state == ImportJob.State.FAILED:  # on the site's row too, shown by ctl facility import status
        log.warning("NetBox sync failed: %s", job.error)


def _prune() -> None:
    """The oldest ended jobs past KEEP go."""
    stale = ImportJob.objects.filter(state__in=ENDED).order_by("-id").values_list("id", flat=True)[KEEP:KEEP + 1000]
    ImportJob.objects.filter(id__in=list(stale)).delete()


def _queue(job_id: int) -> None:
    from llmgw import inprocess
    from llmgw.celery import app

    if not app.conf.task_always_eager:
        transaction.on_commit(lambda: _send(job_id))
    elif inprocess.running():  # `llmgw serve` without Redis: its import thread, once the row is committed
        transaction.on_commit(lambda: _embedded.submit(_run_in_thread, job_id))
    else:  # a command or a test with no server: no one else would run it
        import_job_run(job_id=job_id)


def _send(job_id: int) -> None:
    from kombu.exceptions import OperationalError as BrokerUnreachable

    from llmgw.celery import app

    try:
        # By name: facility.tasks runs these jobs, so importing it here would make a circle.
        app.send_task(
            "facility.tasks.netbox_import_run", args=[job_id], task_id=f"netbox-import-{job_id}", expires=LOST_SECONDS,
        )
    except BrokerUnreachable as exc:
        _end(job_id, state=ImportJob.State.FAILED, error=f"not queued: Redis did not take the task ({exc})")


def _run_in_thread(job_id: int) -> None:
    try:
        import_job_run(job_id=job_id)
    except Exception:  # recorded on the row where it could be; the thread serves the next job
        log.exception("NetBox import job %s failed", job_id)
    finally:
        close_old_connections()


class Progress:
    """The job's phase and objects read, written to its row (the objects read at most every PROGRESS_SECONDS)
    on a connection given back at once: the job holds none while NetBox answers."""

    def __init__(self, job_id: int):
        self.job_id = job_id
        self.phase = ""
        self.written_at = 0.0

    def __call__(self, phase: str, *, read: int | None = None) -> None:
        now = time.monotonic()
        if phase == self.phase and now - self.written_at < PROGRESS_SECONDS:
            return
        self.phase, self.written_at = phase, now
        values: dict[str, Any] = {"phase": phase[:200]}
        if read is not None:
            values["objects_read"] = read
        ImportJob.objects.filter(pk=self.job_id).update(**values)
        if not connection.in_atomic_block:
            connection.close()


def import_job_run(*, job_id: int) -> None:
    """Run a queued job to its end, its outcome on its row. A job started or ended already is left as it is
    (a task delivered twice)."""
    from facility.netbox_import import change_count, netbox_api, netbox_import, plan_from_api
    from facility.netbox_sync import netbox_sync
    from llmgw.outbound import is_time_limit

    now = timezone.now()
    if not ImportJob.objects.filter(pk=job_id, state=ImportJob.State.QUEUED).update(
            state=ImportJob.State.RUNNING, started_at=now, phase="starting"):
        return
    job = ImportJob.objects.get(pk=job_id)
    ImportJob.objects.filter(pk=job_id).update(token="")  # read once: not kept past its use
    progress = Progress(job_id)
    try:
        if job.kind == ImportJob.Kind.SYNC:
            result = netbox_sync(confirm=job.confirm, dry_run=job.dry_run, progress=progress)
        else:
            options = job.options or {}
            plan = plan_from_api(
                netbox_api(url=job.url, token=job.token), site=job.site or None, roles=options.get("roles") or None,
                row_from=options.get("row_from", "location"), device_map=options.get("map") or None, progress=progress,
            )
            progress("computing the diff" if job.dry_run else "applying")
            result = netbox_import(plan=plan, dry_run=job.dry_run, confirm=job.confirm)
    except LlmgwError as exc:
        _end(job_id, state=ImportJob.State.FAILED, error=exc.message, field=exc.field or "")
        return
    except BaseException as exc:
        reason = ("it ran past its time limit" if is_time_limit(exc)
                  else f"{type(exc).__name__}: {str(exc)[:300]} (the server's log has the rest)")
        if is_time_limit(exc):  # the limit may have struck inside a database command: a connection of its own
            connection.close()
        _end(job_id, state=ImportJob.State.FAILED, error=f"the import stopped: {reason}")
        raise
    applied = change_count(result) if result.get("applied") else 0
    _end(job_id, state=ImportJob.State.DONE, result=result, applied=applied)


def _end(job_id: int, *, state: str, result: dict | None = None, applied: int = 0, error: str = "",
         field: str = "") -> None:
    phase = "done" if state == ImportJob.State.DONE else "failed"
    ImportJob.objects.filter(pk=job_id).update(
        state=state, phase=phase, result=result, objects_applied=applied, error=error[:2000], error_field=field[:100],
        token="", finished_at=timezone.now(),
    )


def jobs_lost_fail() -> int:
    """Fail the jobs queued or running past LOST_SECONDS (their worker was stopped); how many."""
    cutoff = timezone.now() - timedelta(seconds=LOST_SECONDS)
    return ImportJob.objects.filter(state__in=ACTIVE, created_at__lt=cutoff).update(
        state=ImportJob.State.FAILED, phase="failed", token="", finished_at=timezone.now(),
        error=f"lost: no worker ended it within {LOST_SECONDS // 60} minutes (was a worker stopped?); run it again",
    )


def import_job_get(job_id: int) -> ImportJob:
    """One job as it stands (NotFound naming the id)."""
    jobs_lost_fail()
    # An id past what the database's integer holds names no job (asked of the database, it would be an error).
    job = ImportJob.objects.filter(pk=job_id).first() if 0 < job_id < 2**63 else None
    if job is None:
        raise NotFound(f"job: no NetBox import job {job_id} (the newest {KEEP} are kept)", field="job")
    return job


def jobs_recent(limit: int = 50) -> list[ImportJob]:
    """The newest jobs, newest first."""
    jobs_lost_fail()
    return list(ImportJob.objects.all()[:limit])


def jobs_shown() -> list[dict[str, Any]]:
    """What the Facility page says of the imports (one query): each job queued or running, and the newest job
    to end in the last hour if it failed."""
    from django.db.models import Q

    hour_ago = timezone.now() - timedelta(hours=1)
    recent = ImportJob.objects.filter(Q(state__in=ACTIVE) | Q(finished_at__gt=hour_ago)).order_by("-id")
    out = []
    last_ended = None
    for job in recent[:MAX_ACTIVE * 2 + 1]:
        if job.state in ACTIVE:
            out.append({"id": job.pk, "state": job.state, "text": job_progress_text(_fields(job)),
                        "since": job.created_at.timestamp()})
        elif last_ended is None:
            last_ended = job
    if last_ended is not None and last_ended.state == ImportJob.State.FAILED:
        out.append({"id": last_ended.pk, "state": last_ended.state, "text": job_progress_text(_fields(last_ended)),
                    "since": last_ended.finished_at.timestamp()})
    return sorted(out, key=lambda j: j["id"])


def _fields(job: ImportJob) -> dict[str, Any]:
    return {"id": job.pk, "kind": job.kind, "state": job.state, "phase": job.phase, "dry_run": job.dry_run,
            "objects_read": job.objects_read, "objects_applied": job.objects_applied, "error": job.error}
