"""What heartbeats ask of the workers is coalesced: a burst of nodes joining queues one reconcile and
one rewrite of the feed-derived caps, never one task per node, and neither runs inside a heartbeat;
condition evaluation has its own queue, which a backlog of reconciles never holds back."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import redis

from facility.models import Budget

from . import conftest

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
FEEDS = """\
facility:
  feeds:
    - {name: A1, voltage: 415, amperage: 32, phase: three, max_utilization: 0.8, pdus: [r1-a]}
    - {name: B1, voltage: 415, amperage: 32, phase: three, max_utilization: 0.8, pdus: [r1-b]}
"""


def queued(url: str, queue: str = "celery") -> list[str]:
    """The names of the tasks waiting in ``queue`` (kombu's Redis list), oldest first."""
    client = redis.Redis.from_url(url)
    return [json.loads(raw)["headers"]["task"] for raw in reversed(client.lrange(queue, 0, -1))]


def test_a_burst_of_joins_queues_one_reconcile(celery_on_redis, join_node):
    for i in range(20):
        join_node(f"gpu{i:02}")
    assert queued(celery_on_redis).count("placement.tasks.reconcile") == 1


def test_a_reconcile_starting_lets_the_next_change_ask_again(celery_on_redis, join_node):
    from llmgw.coalesce import pending_clear
    from placement.tasks import RECONCILE_PENDING

    join_node("gpu01")
    join_node("gpu02")
    assert queued(celery_on_redis).count("placement.tasks.reconcile") == 1
    pending_clear(RECONCILE_PENDING)  # what the queued reconcile does first, before it reads anything
    join_node("gpu03")
    assert queued(celery_on_redis).count("placement.tasks.reconcile") == 2


def test_joins_ask_for_the_feed_caps_once_and_no_heartbeat_writes_them(celery_on_redis, join_node):
    from facility import services

    join_node("gpu01", rack="r1", pdu="r1-a,r1-b")
    services.facility_apply(text=FEEDS)
    assert Budget.objects.filter(domain="rack:r1").exists()
    redis.Redis.from_url(celery_on_redis).flushdb()  # what was asked so far, as if the workers had run it
    for i in range(2, 12):
        join_node(f"gpu{i:02}", rack="r2", pdu="r1-a,r1-b")  # a rack new to the feeds' PDUs
    assert queued(celery_on_redis).count("facility.tasks.feed_caps_refresh") == 1
    assert not Budget.objects.filter(domain="rack:r2").exists()  # not in the heartbeats
    from facility.tasks import feed_caps_refresh

    feed_caps_refresh()  # as the worker runs it
    assert round(Budget.objects.get(domain="rack:r2").cap_watts) == 18401


def test_a_comeback_asks_for_no_feed_caps(celery_on_redis, join_node):
    from datetime import timedelta

    from django.utils import timezone

    from agents.models import Node
    from facility import services

    join_node("gpu01", rack="r1", pdu="r1-a,r1-b")
    services.facility_apply(text=FEEDS)
    Node.objects.filter(name="gpu01").update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    redis.Redis.from_url(celery_on_redis).flushdb()  # what was asked so far, as if the workers had run it
    join_node("gpu01", rack="r1", pdu="r1-a,r1-b")  # back, its domains as they were
    assert queued(celery_on_redis) == ["placement.tasks.reconcile"]


def conditions_worker_command() -> list[str]:
    """The shipped conditions worker's command line (deploy/systemd/llmgw-conditions.service)."""
    unit = (ROOT / "deploy" / "systemd" / "llmgw-conditions.service").read_text()
    line = re.search(r"^ExecStart=(.*)$", unit, re.MULTILINE).group(1)
    words = line.replace("%%H", "%h").split()
    assert words[0] == "/opt/llmgw/bin/llmgw"
    return [conftest.LLMGW, *words[1:]]


@pytest.mark.slow
def test_condition_evaluation_runs_while_the_default_queue_holds_a_backlog(celery_on_redis, tmp_path):
    import os

    from facility.tasks import evaluate_conditions
    from placement.tasks import reconcile

    for _ in range(300):
        reconcile.apply_async()  # a backlog no worker here takes
    sent = evaluate_conditions.delay()
    env = {k: v for k, v in os.environ.items() if k != "LLMGW_CONFIG"}
    env.update(DATABASE_URL=conftest.test_database_url(), REDIS_URL=celery_on_redis)
    log_path = tmp_path / "conditions.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [*conditions_worker_command(), "--pool", "solo", "--without-gossip", "--without-mingle",
             "--without-heartbeat"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        done = f"Task facility.tasks.evaluate_conditions[{sent.id}] succeeded"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and done not in log_path.read_text() and proc.poll() is None:
            time.sleep(0.2)
        assert done in log_path.read_text(), log_path.read_text()[-3000:]
    finally:
        proc.terminate()
        proc.wait(20)
    assert queued(celery_on_redis).count("placement.tasks.reconcile") == 300  # the backlog is still there
