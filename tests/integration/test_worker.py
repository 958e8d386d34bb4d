"""Production wiring: a task sent through Redis runs in a real `llmgw worker` process."""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def test_a_reconcile_sent_through_redis_runs_in_the_worker(worker):
    from placement.tasks import reconcile

    reconcile.delay()
    log = worker.log_dir / "worker-1.log"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and "placement.tasks.reconcile" not in log.read_text():
        time.sleep(0.1)
    while time.monotonic() < deadline and "succeeded" not in log.read_text():
        time.sleep(0.1)
    assert "succeeded" in log.read_text(), log.read_text()[-2000:]
