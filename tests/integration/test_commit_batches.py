"""Batches of plans committed together, each before the next is planned; what did not commit is planned
again; models placed one after another in one run (PostgreSQL)."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from agents.models import Node
from placement import commit, snapshot
from placement.commit import Lane, batches, lanes_place, recheck, replicas_place, single, writes
from placement.commit import run as commit_run
from placement.index import PlacementIndex
from placement.models import GpuBooking, Model, NodeBooking, Replica, ReplicaState, Shard

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


@pytest.fixture(autouse=True)
def _postgresql():
    if connection.vendor != "postgresql":
        pytest.fail("this test needs PostgreSQL: run it with DATABASE_URL=postgres://… (make test does)")


def cluster(join_node, count: int) -> None:
    for i in range(count):
        join_node(f"n{i}", rack=f"r{i}")
    Node.objects.update(heartbeat_interval_seconds=3600)


def place(model: Model, batch: int, index: PlacementIndex | None = None):
    index = index or PlacementIndex(snapshot.node_views(), snapshot.facility_view())
    return replicas_place(
        replicas=snapshot.pending_replicas(model), request=snapshot.replica_request(model), index=index, batch=batch
    )


def nodes_by_ordinal(model: Model) -> dict[int, str]:
    return dict(Shard.objects.filter(replica__model=model).values_list("replica__ordinal", "node__name"))


def make(name: str, replicas: int) -> Model:
    model = Model.objects.create(name=name, replicas=replicas, gpus=8)
    Replica.objects.bulk_create([Replica(model=model, ordinal=i + 1) for i in range(replicas)])
    return model


def test_batches_place_what_one_at_a_time_would(join_node, monkeypatch):
    cluster(join_node, 8)
    model = make("m", 6)
    transactions = []
    commit_batch = batches._commit_batch

    def counted(planned, *args):
        transactions.append(len(planned))
        return commit_batch(planned, *args)

    monkeypatch.setattr(commit_run, "_commit_batch", counted)
    outcomes, stopped = place(model, batch=2)
    assert stopped is None and all(outcome.plan is not None for _, outcome in outcomes)
    assert transactions == [2, 2, 2]
    batched = nodes_by_ordinal(model)
    assert sorted(batched.values()) == [f"n{i}" for i in range(6)]
    assert GpuBooking.objects.count() == 48
    assert all(r.explain.get("why") for r in Replica.objects.filter(model=model))
    assert connection.connection.info.transaction_status == 0  # idle: nothing left open

    # The same one at a time: the same nodes for the same replicas.
    Shard.objects.all().delete()
    GpuBooking.objects.all().delete()
    NodeBooking.objects.all().delete()
    Replica.objects.update(state=ReplicaState.PENDING, explain={}, reason="")
    place(model, batch=1)
    assert nodes_by_ordinal(model) == batched


def test_a_lost_race_found_by_the_write_rolls_the_batch_back_and_plans_it_again(join_node):
    cluster(join_node, 4)
    model = make("m", 4)
    stale = PlacementIndex(snapshot.node_views(), snapshot.facility_view())
    # Another placer takes n0 after this index was read: the index still has n0's cards free, and its
    # first plan goes there. The locks and checks cannot see a card's booking; the write can.
    place(make("other", 1), batch=2)
    assert nodes_by_ordinal(Model.objects.get(name="other")) == {1: "n0"}

    outcomes, stopped = place(model, batch=2, index=stale)

    placed = nodes_by_ordinal(model)
    assert sorted(placed.values()) == ["n1", "n2", "n3"]  # n0 is the other model's, booked once
    assert GpuBooking.objects.count() == 32
    assert Shard.objects.filter(node__name="n0").count() == 1
    conflicts = [c for r in Replica.objects.filter(model=model) for c in r.explain.get("conflicts", [])]
    assert "n0: GPUs 0-7 were booked meanwhile" in conflicts
    waiting = Replica.objects.get(model=model, state=ReplicaState.PENDING)
    assert waiting.reason.startswith("no node fits (4 nodes)")
    assert stopped is not None and stopped.pk == waiting.pk
    assert connection.connection.info.transaction_status == 0


def break_batch(monkeypatch, number: int) -> list[bool]:
    """The `number`th batch write divides by zero, on the server; each write's `strict`, in order."""
    write = writes._batch_write
    calls: list[bool] = []

    def broken(*args, strict=False, **kwargs):
        sql, params = write(*args, strict=strict, **kwargs)
        calls.append(strict)
        if len(calls) == number:
            sql = sql.replace("SELECT o.*", "SELECT o.*, 1 / 0", 1)
        return sql, params

    monkeypatch.setattr(writes, "_batch_write", broken)
    return calls


def test_a_database_error_in_a_batch_is_raised_and_leaves_no_transaction_open(join_node, monkeypatch):
    cluster(join_node, 6)
    model = make("m", 6)
    calls = break_batch(monkeypatch, 2)
    with pytest.raises(DatabaseError, match="division by zero"):
        place(model, batch=2)
    assert calls == [False, False]
    # The first batch committed; nothing of the second was written; the connection is idle and usable.
    assert sorted(nodes_by_ordinal(model)) == [1, 2]
    assert connection.connection.info.transaction_status == 0
    assert Replica.objects.filter(model=model, state=ReplicaState.PLACED).count() == 2


def test_a_model_that_runs_out_is_told_why_from_one_no_fit(join_node, monkeypatch):
    cluster(join_node, 4)
    model = make("m", 6)
    nofits = []
    plan = PlacementIndex.plan

    def counted(self, request, **kwargs):
        result = plan(self, request, **kwargs)
        if not hasattr(result, "shards"):
            nofits.append(result.summary)
        return result

    monkeypatch.setattr(PlacementIndex, "plan", counted)
    outcomes, stopped = place(model, batch=2)
    # Two batches of two; the fifth replica finds no node once the second committed: its answer stands.
    assert len(nofits) == 1 and nofits[0].startswith("no node fits (4 nodes)")
    waiting = Replica.objects.get(model=model, ordinal=5)
    assert waiting.state == ReplicaState.PENDING and waiting.reason == nofits[0]
    assert stopped is not None and stopped.pk == waiting.pk
    assert [r.pk for r, _ in outcomes] == list(
        Replica.objects.filter(model=model, ordinal__lte=5).order_by("ordinal").values_list("pk", flat=True)
    )


# -- several models in one run, one after another ----------------------------------------------------


def lanes_of(*models: Model) -> list[Lane]:
    return [Lane(snapshot.pending_replicas(m), snapshot.replica_request(m)) for m in models]


def test_a_database_error_in_one_models_batch_marks_its_lane_and_leaves_the_ones_before_it_placed(
    join_node, monkeypatch
):
    cluster(join_node, 6)
    first, second = make("a", 2), make("b", 2)
    break_batch(monkeypatch, 2)  # b's batch
    lanes = lanes_of(first, second)
    with pytest.raises(DatabaseError, match="division by zero"):
        lanes_place(lanes=lanes, index=PlacementIndex(snapshot.node_views(), snapshot.facility_view()), batch=2)
    assert lanes[0].error is None and lanes[1].error is not None
    assert [outcome.plan is not None for _, outcome in lanes[0].tried()] == [True, True]
    assert Replica.objects.filter(model=second, state=ReplicaState.PLACED).count() == 0
    assert connection.connection.info.transaction_status == 0


def test_a_bound_on_tries_counts_across_the_models_and_cuts_the_rest(join_node):
    cluster(join_node, 8)
    first, second, third = make("a", 2), make("b", 2), make("c", 2)
    lanes = lanes_of(first, second, third)
    lanes_place(
        lanes=lanes, index=PlacementIndex(snapshot.node_views(), snapshot.facility_view()), batch=2, max_tries=3
    )
    assert [len(lane.tried()) for lane in lanes] == [2, 1, 0]
    assert [lane.cut for lane in lanes] == [False, True, True]
    assert Replica.objects.filter(state=ReplicaState.PLACED).count() == 3


def test_reconcile_marks_the_model_whose_batch_failed_and_places_the_next_on_a_fresh_index(
    join_node, monkeypatch
):
    from placement import reconcile

    cluster(join_node, 2)  # room for one of the two: b fits only once a's failed plans are forgotten
    Model.objects.create(name="a", replicas=2, gpus=8)
    Model.objects.create(name="b", replicas=2, gpus=8)
    break_batch(monkeypatch, 1)  # a's batch
    run = reconcile.reconcile_all()
    assert run.failed == 1
    assert Model.objects.get(name="a").error.startswith("DataError: division by zero")
    assert Model.objects.get(name="b").error == ""
    assert Replica.objects.filter(model__name="b", state=ReplicaState.PLACED).count() == 2
    assert Replica.objects.filter(model__name="a", state=ReplicaState.PLACED).count() == 0
    assert connection.connection.info.transaction_status == 0


def test_a_database_error_writing_the_stops_reasons_marks_the_model_that_stopped(join_node, monkeypatch):
    from placement import reconcile

    cluster(join_node, 2)
    Model.objects.create(name="a", replicas=1, gpus=8)
    Model.objects.create(name="b", replicas=3, gpus=8)  # one fits beside a's; its second stops

    def refused(replica, reason, explain):
        raise DatabaseError("the reasons were refused")

    monkeypatch.setattr(commit_run, "replica_pending", refused)
    run = reconcile.reconcile_all()
    assert Model.objects.get(name="b").error == "DatabaseError: the reasons were refused"
    assert Model.objects.get(name="a").error == ""
    assert run.failed == 1 and run.placed == 2  # a's and b's first, committed before the reasons
    assert Replica.objects.filter(state=ReplicaState.PLACED).count() == 2


def test_a_replica_that_has_had_its_tries_is_not_tried_again_when_a_later_model_fails(join_node, monkeypatch):
    from placement import reconcile

    cluster(join_node, 2)
    Model.objects.create(name="a", replicas=1, gpus=8)
    Model.objects.create(name="b", replicas=1, gpus=8)
    monkeypatch.setattr(single, "MAX_ATTEMPTS", 1)
    monkeypatch.setattr(batches, "MAX_ATTEMPTS", 1)
    check = recheck._Locked.check

    def a_loses(self, shards, domains_of, facility, now, **kwargs):
        if shards[0].node == "n0":  # a's plan, first in the name order
            raise commit.LostRace("n0", "n0: taken meanwhile")
        return check(self, shards, domains_of, facility, now, **kwargs)

    plan = PlacementIndex.plan

    def b_breaks(self, request, **kwargs):
        if request.model == "b":
            raise ZeroDivisionError("a bug")
        return plan(self, request, **kwargs)

    monkeypatch.setattr(recheck._Locked, "check", a_loses)
    monkeypatch.setattr(PlacementIndex, "plan", b_breaks)
    run = reconcile.reconcile_all()
    waiting = Replica.objects.get(model__name="a")
    assert waiting.reason == "Unschedulable after 1 conflicting attempts: n0: taken meanwhile"
    assert (run.tried, run.placed, run.pending, run.failed) == (1, 0, 1, 1)
    assert Model.objects.get(name="b").error == "ZeroDivisionError: a bug"


@pytest.fixture
def plan_modes(monkeypatch):
    """The server's plan_cache_mode under the locks of every commit, as its re-check ran (between the read
    and the write, inside the transaction)."""
    seen: list[str] = []
    check = recheck._Locked.check

    def spy(self, *args, **kwargs):
        seen.append(connection.connection.execute("SHOW plan_cache_mode").fetchone()[0])
        return check(self, *args, **kwargs)

    monkeypatch.setattr(recheck._Locked, "check", spy)
    return seen


def test_a_commits_statements_run_on_generic_plans_and_the_connection_keeps_the_servers_setting(
    join_node, plan_modes, settings
):
    cluster(join_node, 7)
    default = connection.connection.execute("SHOW plan_cache_mode").fetchone()[0]
    assert default == "auto"
    model = make("m", 5)
    index = PlacementIndex(snapshot.node_views(), snapshot.facility_view())
    placed = single.replica_place(
        replica=snapshot.pending_replicas(model)[0], request=snapshot.replica_request(model), index=index
    )
    assert placed.plan is not None
    place(model, batch=2, index=index)  # two batches of two
    # One at a time, then each batch: the read under the locks and the write are planned once and reused.
    assert plan_modes == ["force_generic_plan"] * 5, plan_modes
    # SET LOCAL: the rest of the process's statements are planned as the server decides.
    assert connection.connection.execute("SHOW plan_cache_mode").fetchone()[0] == default
    assert Replica.objects.filter(model=model, state=ReplicaState.PLACED).count() == 5

    # Without the pipeline, in a transaction of its own: the same; in a caller's, the caller's setting.
    settings.LLMGW_COMMIT_PIPELINE = False
    plan_modes.clear()
    more = make("more", 2)
    request, (first, second) = snapshot.replica_request(more), snapshot.pending_replicas(more)
    assert single.replica_place(replica=first, request=request, index=index).plan is not None
    with transaction.atomic():
        assert single.replica_place(replica=second, request=request, index=index).plan is not None
    assert plan_modes == ["force_generic_plan", default]
    assert connection.connection.execute("SHOW plan_cache_mode").fetchone()[0] == default
