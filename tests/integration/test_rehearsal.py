"""The rehearsal (bench/rehearsal.py) in short, and its independent auditor (bench/auditor.sql).

A short rehearsal — several processes placing, scaling, freeing, holding, draining, moving labels,
changing budgets and sending heartbeats with drifting power — must leave the auditor nothing to
report; and the auditor must report a double booking planted after such a run (it can fail).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import test_database_url as database_url

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.django_db


def rehearse(*extra: str) -> subprocess.CompletedProcess:
    """bench/rehearsal.py on its own database, on the test server (named after the test database)."""
    url = database_url()
    name = f"{url.rsplit('/', 1)[1]}_rehearsal"[:63]
    env = {**os.environ, "DATABASE_URL": url}
    env.pop("REDIS_URL", None)
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / "rehearsal.py"), "--nodes", "200", "--processes", "3",
         "--database", name, *extra],
        env=env, capture_output=True, text=True, timeout=240, cwd=ROOT,
    )


def events_made(stdout: str) -> int:
    """The events the run's summary line counts (after its progress lines)."""
    line = next(line for line in stdout.splitlines() if " events in " in line)
    return int(line.split(" events in ", 1)[0].replace(",", ""))


def test_a_short_rehearsal_leaves_the_auditor_nothing_to_report():
    done = rehearse("--events", "3000", "--seconds", "60")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "violations: 0" in done.stdout
    # It ran until the processes together had made the events asked for (each finishes the one it is in).
    assert events_made(done.stdout) >= 3000, done.stdout
    # Every kind of event happened, and placements were logged for the limit check.
    summary = next(line for line in done.stdout.splitlines() if " events in " in line)
    for kind in ("heartbeat", "scale", "hold", "label", "budget"):
        assert f"{kind} " in summary, done.stdout
    logged = int(done.stdout.split("auditor: ", 1)[1].split(" logged", 1)[0].replace(",", ""))
    assert logged > 0


def test_the_auditor_reports_a_planted_double_booking():
    done = rehearse("--seconds", "3", "--plant")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "gpu booked twice" in done.stdout
    # The planted shard's cards have no booking rows of their own (the unique (node, card) refused them).
    assert "card without booking" in done.stdout


def test_two_web_processes_two_workers_beat_and_four_placers_leave_the_auditor_nothing_to_report():
    from tests.integration.conftest import redis_url

    url = database_url()
    name = f"{url.rsplit('/', 1)[1]}_scale_out"[:63]
    env = {**os.environ, "DATABASE_URL": url, "REDIS_URL": redis_url()}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "rehearsal.py"), "--scale-out", "--nodes", "200", "--processes", "4",
         "--seconds", "30", "--database", name],
        env=env, capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "violations: 0" in done.stdout
    # The web processes took scales, and the workers ran reconciles they queued.
    assert " web " in done.stdout.replace(",", " "), done.stdout
    tasks = int(done.stdout.split("workers (", 1)[1].split(" tasks", 1)[0])
    assert tasks > 0
