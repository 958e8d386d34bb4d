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


def apply(name: str, replicas: int, gpus: int, min_ready: int) -> None:
    models_apply(
        text=f"kind: Model\nname: {name}\nreplicas: {replicas}\nprofile:\n  gpus: {gpus}\n"
        f"  min_ready_seconds: {min_ready}\n"
    )


def test_release_mid_drain_stops_it_and_moved_replicas_stay(worker):
    from facility.services import hold_release

    cluster = Cluster({"r1": 2, "r2": 2}, ready_delay=1.0, reconcile=False)
    cluster.tick()
    apply("llama", 4, gpus=4, min_ready=2)
    tick_until(cluster, lambda: ready_counts()["llama"] == 4, seconds=60)
    start = shards_in("r1")
    assert start >= 2

    hold_create(domain="rack:r1", reason="PDU swap", drain=True)
    tick_until(cluster, lambda: shards_in("r1") < start, seconds=60)
    hold_release(domain="rack:r1")
    tick_until(cluster, lambda: not Replica.objects.filter(replaces__isnull=False).exists(), seconds=30)
    settled = shards_in("r1")
    for _ in range(10):
        cluster.tick(0.5)
        time.sleep(0.2)
    assert shards_in("r1") == settled > 0  # the drain stopped; what moved stays moved
    assert Replica.objects.count() == 4
    assert ready_counts()["llama"] == 4


def test_a_blocked_drain_says_why_and_completes_once_a_node_is_added(worker, api):
    cluster = Cluster({"r1": 1, "r2": 1}, ready_delay=1.0, reconcile=False)
    cluster.tick()
    apply("llama", 2, gpus=8, min_ready=1)
    tick_until(cluster, lambda: ready_counts()["llama"] == 2, seconds=60)

    hold_create(domain="rack:r1", reason="PDU swap", drain=True)

    def blocked():
        rack = next(d for d in api.get("/api/v1/facility").json()["domains"] if d["domain"] == "rack:r1")
        return rack["hold"]["drain_progress"]["blocked"]

    tick_until(cluster, lambda: bool(blocked()), seconds=30)
    assert blocked()[0]["reason"] == (
        "no node fits (2 nodes): 1 × gpu: 8 requested, 0 free; 1 × rack r1 is held: PDU swap"
    )
    assert ready_counts()["llama"] == 2

    cluster.add("n-r3-0", "r3")
    tick_until(
        cluster,
        lambda: shards_in("r1") == 0 and ready_counts()["llama"] == 2
        and not Replica.objects.filter(replaces__isnull=False).exists(),
        seconds=60,
    )
