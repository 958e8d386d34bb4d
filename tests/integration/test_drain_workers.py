"""Drains on real Celery workers (PostgreSQL + Redis): progress lives in the database, so a worker
killed with -9 mid-drain loses nothing; the next worker finishes the drain."""

from __future__ import annotations

import textwrap
import time

import pytest

from facility.services import hold_create
from placement.models import Replica, Shard
from placement.services import models_apply
from tests.integration.drive import Cluster, ready_counts

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

MODELS = ("llama", "mistral", "qwen")


def shards_in(rack: str) -> int:
    return Shard.objects.filter(node__domains__domain=f"rack:{rack}").count()


def tick_until(cluster: Cluster, done, *, seconds: float, watch=None) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        cluster.tick(0.5)
        if watch:
            watch()
        if done():
            return
        time.sleep(0.2)
    raise AssertionError(f"not done in {seconds} s: ready {dict(ready_counts())}, replicas {Replica.objects.count()}")


def test_a_drain_survives_a_killed_worker(worker):
    cluster = Cluster({"r1": 2, "r2": 2, "r3": 2, "r4": 2}, ready_delay=1.0, reconcile=False)
    cluster.tick()
    for name in MODELS:
        models_apply(
            text=textwrap.dedent(
                f"""\
                kind: Model
                name: {name}
                replicas: 3
                profile:
                  gpus: 4
                  min_ready_seconds: 1
                """
            )
        )
    tick_until(cluster, lambda: all(ready_counts()[m] == 3 for m in MODELS), seconds=60)
    assert shards_in("r1") > 0
    lowest = {m: 3 for m in MODELS}

    def watch():
        counts = ready_counts()
        for m in MODELS:
            lowest[m] = min(lowest[m], counts[m])

    hold_create(domain="rack:r1", reason="PDU swap", drain=True)
    start = shards_in("r1")
    tick_until(cluster, lambda: shards_in("r1") < start, seconds=60, watch=watch)
    worker.kill()  # kill -9, mid-drain
    worker.start()
    tick_until(
        cluster,
        lambda: shards_in("r1") == 0 and all(ready_counts()[m] == 3 for m in MODELS)
        and not Replica.objects.filter(replaces__isnull=False).exists(),
        seconds=90,
        watch=watch,
    )
    assert lowest == {m: 3 for m in MODELS}
    assert Replica.objects.count() == 9
    assert sorted(Replica.objects.values_list("model__name", flat=True)) == sorted(MODELS * 3)
