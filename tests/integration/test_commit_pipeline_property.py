"""The promise of the commit pipeline, stated for any world Hypothesis draws (PostgreSQL): a run of lanes
with each batch's write and COMMIT pipelined ends exactly as the same run with every commit waited for —
the same replicas on the same nodes, the same stops and reasons, the same lost races, the same error on
the same lane — however many races were lost behind its back (cards booked by another placer, nodes
cordoned, a PDU's power taken after its index was read) and whichever batch the database fails, and
nothing is booked twice.

The lanes' pipeline is kept on its measured gain (bench/RESULTS.md); this is the test of its promise,
run against the real committer rather than a model of one, so the SQL's own lost races are in it."""

from __future__ import annotations

from collections import Counter

import pytest
from django.db import DatabaseError, connection
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from agents.models import Node
from agents.services import heartbeat_record
from agents.simulator.cluster import heartbeat_for
from facility.services import budget_set
from placement import snapshot
from placement.commit import Lane, batches, lanes_place, writes
from placement.index import PlacementIndex
from placement.models import GpuBooking, Model, Replica, Shard
from tests.conftest import node_spec

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

GPUS = 8


@st.composite
def worlds(draw):
    nodes = draw(st.integers(3, 6))
    models = draw(st.lists(st.tuples(st.sampled_from([2, 4, 8]), st.integers(1, 5)), min_size=1, max_size=3))
    return {
        "nodes": nodes,
        "models": models,
        "batch": draw(st.integers(2, 3)),
        # Behind the index's back, after it was read: another placer's 8-card replicas on these nodes,
        "taken": draw(st.sets(st.integers(0, nodes - 1), max_size=2)),
        # these nodes cordoned,
        "cordoned": draw(st.sets(st.integers(0, nodes - 1), max_size=2)),
        # and a cap on the PDU all nodes share (None: no budget), which the other placer's draw eats into;
        "pdu_cap": draw(st.sampled_from([None, 8_000, 14_000, 30_000])),
        # the database fails the first batch write that carries this replica (model, ordinal), if any.
        "fails": draw(st.none() | st.tuples(st.integers(0, len(models) - 1), st.integers(1, 5))),
    }


def _wipe() -> None:
    from agents import readings

    readings.forget()  # the nodes are made again: their first heartbeats are new, not readings
    readings.invalidate_assignments()
    Shard.objects.all().delete()
    GpuBooking.objects.all().delete()
    Model.objects.all().delete()
    Node.objects.all().delete()
    from facility.models import Budget

    Budget.objects.all().delete()


def _failing(monkeypatch, replica_id: int | None) -> None:
    """The first batch write carrying ``replica_id`` divides by zero, on the server."""
    write = writes._batch_write
    failed: list[bool] = []

    def maybe_broken(plans, *args, **kwargs):
        sql, params = write(plans, *args, **kwargs)
        if not failed and any(plan[0] == replica_id for plan in plans):
            failed.append(True)
            sql = sql.replace("SELECT o.*", "SELECT o.*, 1 / 0", 1)
        return sql, params

    monkeypatch.setattr(batches, "_batch_write", maybe_broken)
    monkeypatch.setattr(writes, "_batch_write", maybe_broken)


def _run(world: dict, *, pipelined: bool, settings, monkeypatch) -> dict:
    """Build the world afresh, read the index, let the other placer and the cordons in behind its back,
    place every model's replicas in one run of lanes; what became of each replica, by model and ordinal."""
    _wipe()
    for i in range(world["nodes"]):
        heartbeat_record(
            node_name=f"n{i}", heartbeat=heartbeat_for(node_spec(f"n{i}", rack=f"r{i}", pdu="p0", gpus=GPUS))
        )
    Node.objects.update(heartbeat_interval_seconds=3600)
    if world["pdu_cap"] is not None:
        budget_set(domain="pdu:p0", cap_watts=world["pdu_cap"])
    models = []
    for number, (gpus, replicas) in enumerate(world["models"]):
        model = Model.objects.create(name=f"m{number}", replicas=replicas, gpus=gpus)
        Replica.objects.bulk_create([Replica(model=model, ordinal=i + 1) for i in range(replicas)])
        models.append(model)
    other = Model.objects.create(name="other", replicas=len(world["taken"]), gpus=GPUS)
    index = PlacementIndex(snapshot.node_views(), snapshot.facility_view())

    for i in sorted(world["taken"]):  # the other placer, on a view of that node alone
        alone = PlacementIndex(snapshot.node_views(names=[f"n{i}"]), snapshot.facility_view())
        replica = Replica.objects.create(model=other, ordinal=i + 1)
        lane = Lane([replica], snapshot.replica_request(other))
        lanes_place(lanes=[lane], index=alone, batch=1)
    Node.objects.filter(name__in=[f"n{i}" for i in world["cordoned"]]).update(cordoned=True)

    doomed = None
    if world["fails"] is not None and world["fails"][0] < len(models):
        number, ordinal = world["fails"]
        doomed = Replica.objects.filter(model=models[number], ordinal=ordinal).values_list("pk", flat=True).first()
    _failing(monkeypatch, doomed)
    settings.LLMGW_COMMIT_PIPELINE = pipelined
    lanes = [Lane(snapshot.pending_replicas(m), snapshot.replica_request(m)) for m in models]
    try:
        lanes_place(lanes=lanes, index=index, batch=world["batch"])
        error = None
    except DatabaseError:
        error = [number for number, lane in enumerate(lanes) if lane.error is not None]
    assert connection.connection.info.transaction_status == 0  # idle: nothing left open

    # Nothing booked twice, no node past its cards, each placed replica's shard as big as it asked.
    booked = Counter(GpuBooking.objects.values_list("node__name", flat=True))
    assert all(count <= GPUS for count in booked.values()), booked
    outcome: dict = {"error on lanes": error}
    for model, lane in zip(models, lanes, strict=True):
        for replica in Replica.objects.filter(model=model).order_by("ordinal"):
            shards = list(Shard.objects.filter(replica=replica).values_list("node__name", "gpu_indices"))
            assert all(len(cards) == model.gpus for _, cards in shards), shards
            outcome[(model.name, replica.ordinal)] = (
                replica.state,
                sorted(node for node, _ in shards),
                replica.reason,
                replica.explain.get("conflicts", []),
            )
        outcome[(model.name, "stopped")] = None if lane.stopped is None else lane.stopped.pk and Replica.objects.get(
            pk=lane.stopped.pk
        ).ordinal
    return outcome


@hsettings(max_examples=30, deadline=None, derandomize=True,
           suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(world=worlds())
def test_pipelined_commits_end_as_if_each_had_waited(world, settings, monkeypatch):
    pipelined = _run(world, pipelined=True, settings=settings, monkeypatch=monkeypatch)
    waited = _run(world, pipelined=False, settings=settings, monkeypatch=monkeypatch)
    assert pipelined == waited, world
