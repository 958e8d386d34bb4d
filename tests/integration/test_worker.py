"""Production wiring: a task sent through Redis runs in a real `llmgw worker` process."""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def test_a_reconcile_sent_through_redis_runs_in_the_worker(worker):
    from placement.tasks import reconcile

    sent = reconcile.delay()
    log = worker.log_dir / "worker-1.log"
    # This message's own id, received and succeeded in the worker: not the beat's reconciles, not a
    # task run in this process (the fixture sends through Redis, CELERY_TASK_ALWAYS_EAGER off).
    received = f"Task placement.tasks.reconcile[{sent.id}] received"
    succeeded = f"Task placement.tasks.reconcile[{sent.id}] succeeded"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and succeeded not in log.read_text():
        time.sleep(0.1)
    text = log.read_text()
    assert received in text, text[-2000:]
    assert succeeded in text, text[-2000:]
