"""A NetBox import job in the words ctl and the Facility page say it: pure, so a remote ctl loads no Django."""

from __future__ import annotations

from typing import Any

# A job in either of these states has not ended: ctl follows it, the Facility page shows it.
ACTIVE_STATES = ("queued", "running")


def job_progress_text(job: dict[str, Any]) -> str:
    """A job in one line. ``job``: its fields, as the API answers them (facility.serializers.ImportJobSerializer)."""
    what = f"NetBox {job['kind']} {job['id']}{' (dry run)' if job.get('dry_run') else ''}"
    if job["state"] == "failed":
        return f"{what} failed: {job['error']}"
    read = f", {job['objects_read']:,} objects read" if job.get("objects_read") else ""
    if job["state"] == "done":
        if job.get("dry_run"):
            return f"{what} done{read}: nothing written"
        applied = job.get("objects_applied") or 0
        return f"{what} done{read}, {applied:,} change{'s' if applied != 1 else ''} applied"
    if job["state"] == "queued":
        return f"{what} queued"
    return f"{what} {job['state']}: {job['phase']}{read}"
