"""Races the guarded commit and the drain must survive: a node relabelled after the plan, a replica freed
twice at once, a replacement whose node went quiet."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from agents.models import Node
from agents.services import labels_set
from facility.services import budget_set, hold_create
from placement import reconcile, services
from placement.models import GpuBooking, Model, NodeBooking, Replica, ReplicaState, Shard
from tests.integration.drive import Cluster


def test_a_node_relabelled_into_a_held_full_rack_after_the_plan_is_not_used(join_node, db):
    join_node("a1", rack="ra", pdu="pa")
    Node.objects.update(heartbeat_interval_seconds=3600)
    hold_create(domain="rack:rb", reason="PDU swap")
    budget_set(domain="rack:rb", cap_watts=1000)
    model = Model.objects.create(name="m", replicas=1, gpus=8)
    run = reconcile.ReconcileRun()
    assert run.index.node("a1").domains  # the plan's view: a1 in rack ra
    labels_set(node_name="a1", changes={"llmgw.io/rack": "rb"})  # meanwhile: moved into a held, full rack
    reconcile.replicas_scale(model=model, run=run)
    reconcile.replicas_place_pending(model=model, run=run)
    replica = Replica.objects.get()
    assert replica.state == ReplicaState.PENDING
    assert not Shard.objects.exists()
    assert replica.reason.startswith("no node fits (1 node): 1 × rack rb is held: PDU swap")
    assert replica.explain["conflicts"] == ["a1: its location changed meanwhile"]


@pytest.mark.django_db(transaction=True)
def test_a_replica_freed_twice_at_once_gives_its_room_back_once(join_node):
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    join_node("a1", rack="ra")
    Node.objects.update(heartbeat_interval_seconds=3600)
    Model.objects.create(name="m", replicas=2, gpus=2, cpu_cores=4, memory_gib=10)
    reconcile.reconcile_all()
    assert Shard.objects.count() == 2
    victim = Replica.objects.order_by("ordinal").first()
    barrier = threading.Barrier(2)

    def free():
        barrier.wait()
        try:
            services.replica_free(replica=victim)
        finally:
            connection.close()

    threads = [threading.Thread(target=free) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    booking = NodeBooking.objects.get(node__name="a1")
    assert (booking.cpu_cores, booking.memory_gib) == (4, 10)
    assert GpuBooking.objects.count() == 2
    assert Replica.objects.count() == 1


def test_a_drain_does_not_stop_the_old_replica_for_a_replacement_on_a_node_gone_quiet(db):
    cluster = Cluster({"r1": 1, "r2": 1})
    cluster.tick()
    Model.objects.create(name="m", replicas=1, gpus=8, min_ready_seconds=60)
    for _ in range(5):
        cluster.tick()
    old = Replica.objects.get()
    rack = Shard.objects.get(replica=old).node.labels["llmgw.io/rack"]
    hold_create(domain=f"rack:{rack}", reason="PDU swap", drain=True)
    for _ in range(3):  # the replacement is placed, starts and is ready on the other rack
        cluster.tick()
        replacement = Replica.objects.filter(replaces=old).first()
        if replacement and replacement.state == ReplicaState.READY:
            break
    replacement = Replica.objects.get(replaces=old)
    new_node = Shard.objects.get(replica=replacement).node
    # Ready long enough — but its node went quiet before the drain step runs.
    Replica.objects.filter(pk=replacement.pk).update(ready_since=timezone.now() - timedelta(minutes=5))
    Node.objects.filter(pk=new_node.pk).update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    del cluster.nodes[new_node.name]
    reconcile.reconcile_all()
    assert Replica.objects.filter(pk=old.pk).exists()  # the only replica that surely runs stays
    # Its node back and heartbeating: now the old one stops.
    Node.objects.filter(pk=new_node.pk).update(last_heartbeat_at=timezone.now())
    reconcile.reconcile_all()
    assert not Replica.objects.filter(pk=old.pk).exists()


def test_a_node_that_ran_the_model_is_preferred_for_it_next_time(db):
    from agents.services import node_cordon

    cluster = Cluster({"r1": 2})
    cluster.tick()
    node_cordon(node_name="n-r1-0", cordoned=True)
    model = Model.objects.create(name="m", replicas=1, gpus=8, min_ready_seconds=0)
    for _ in range(4):
        cluster.tick()
    assert Shard.objects.get().node.name == "n-r1-1"
    assert Node.objects.get(name="n-r1-1").weights == ["m"]
    Model.objects.filter(pk=model.pk).update(replicas=0)
    reconcile.reconcile_all()
    node_cordon(node_name="n-r1-0", cordoned=False)
    Model.objects.filter(pk=model.pk).update(replicas=1)
    reconcile.reconcile_all()
    shard = Shard.objects.get()
    assert shard.node.name == "n-r1-1"  # by name alone it would be n-r1-0
    assert "holds the weights" in shard.replica.explain["why"]


def test_the_models_page_says_the_pending_replicas_reason_once_and_counts_them(admin_client, join_node):
    join_node("a1", rack="ra", gpus=8)
    Model.objects.create(name="m", replicas=10, gpus=8)
    reconcile.reconcile_all()
    page = admin_client.get("/models/").content.decode()
    assert page.count(">pending<") == 1
    assert "<strong>9 replicas</strong> (#2 … #10) wait:" in page
    assert "<li>1 node with fewer than 8 GPUs free</li>" in page
    assert page.count("no node fits (1 node): 1 × gpu: 8 requested, 0 free") == 1


@pytest.mark.django_db(transaction=True)
def test_a_hold_that_lands_between_the_checks_and_the_write_stops_the_placement(join_node):
    if connection.vendor != "postgresql":
        pytest.skip("the guarded write is PostgreSQL's")
    import psycopg

    join_node("a1", rack="ra")
    Node.objects.update(heartbeat_interval_seconds=3600)
    model = Model.objects.create(name="m", replicas=1, gpus=8)
    settings = connection.settings_dict
    dsn = f"postgresql://{settings['USER'] or 'postgres'}@{settings['HOST'] or '127.0.0.1'}:{settings['PORT'] or 5432}/{settings['NAME']}"

    def hold_after_the_checks(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.lstrip().startswith("WITH locked"):
            # Another session's hold commits now: after the checks read holds, before the write.
            with psycopg.connect(dsn, autocommit=True) as other:
                other.execute(
                    "INSERT INTO facility_hold (domain, reason, drain, created_by, created_at) "
                    "VALUES ('rack:ra', 'PDU swap', false, 'test', now())"
                )
        return result

    run = reconcile.ReconcileRun()
    reconcile.replicas_scale(model=model, run=run)
    with connection.execute_wrapper(hold_after_the_checks):
        reconcile.replicas_place_pending(model=model, run=run)
    replica = Replica.objects.get()
    assert replica.state == ReplicaState.PENDING
    assert not Shard.objects.exists()
    assert "a1: a domain it is in was held meanwhile" in replica.explain["conflicts"]


def test_a_replica_on_a_node_gone_quiet_shows_as_unreachable_not_ready(db):
    from placement import selectors

    cluster = Cluster({"r1": 1, "r2": 1})
    cluster.tick()
    Model.objects.create(name="m", replicas=2, gpus=8)
    for _ in range(4):
        cluster.tick()
    assert selectors.model_rows()[0]["replicas"]["ready"] == 2
    quiet = Shard.objects.order_by("node__name").first().node
    Node.objects.filter(pk=quiet.pk).update(last_heartbeat_at=timezone.now() - timedelta(minutes=5))
    counts = selectors.model_rows()[0]["replicas"]
    assert (counts["ready"], counts["unreachable"], counts["placed"]) == (1, 1, 2)
    rows = {r["nodes"][0]: r for r in selectors.replica_rows(model="m")}
    assert rows[quiet.name]["state"] == "unreachable"
    assert rows[quiet.name]["reason"] == f"{quiet.name}: not ready (no heartbeat); last reported ready"


def test_replicas_on_a_node_silent_too_long_are_replaced_elsewhere(db, settings):
    settings.LLMGW_EVICT_AFTER_SECONDS = 120
    cluster = Cluster({"r1": 1, "r2": 1})
    cluster.tick()
    Model.objects.create(name="m", replicas=1, gpus=8, min_ready_seconds=0)
    for _ in range(4):
        cluster.tick()
    old = Replica.objects.get()
    dead = Shard.objects.get(replica=old).node
    del cluster.nodes[dead.name]
    Node.objects.filter(pk=dead.pk).update(last_heartbeat_at=timezone.now() - timedelta(seconds=60))
    for _ in range(3):
        cluster.tick()
    assert Replica.objects.get().pk == old.pk  # silent, but not for long: nothing moves yet
    Node.objects.filter(pk=dead.pk).update(last_heartbeat_at=timezone.now() - timedelta(seconds=600))
    for _ in range(6):
        cluster.tick()
    replica = Replica.objects.get()
    assert replica.pk != old.pk
    assert replica.state == ReplicaState.READY
    assert Shard.objects.get(replica=replica).node.name != dead.name
    assert not Shard.objects.filter(node=dead).exists()
