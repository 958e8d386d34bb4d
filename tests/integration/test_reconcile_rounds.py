"""A reconcile round works on what moved: the models whose inputs changed since their last clean
reconcile, each within its own share of the round's time; the others are passed over."""

from __future__ import annotations

import pytest

from placement.models import Model, Replica, ReplicaState
from placement.plugins import REGISTRY, Filter
from placement.reconcile import reconcile_all

pytestmark = pytest.mark.django_db(transaction=True)


def placed(name: str) -> int:
    return Replica.objects.filter(model__name=name, state=ReplicaState.PLACED).count()


def models(**replicas: int) -> None:
    for name, count in replicas.items():
        Model.objects.create(name=name, replicas=count, gpus=1, cpu_cores=1)


def test_a_round_passes_over_the_models_nothing_moved_and_places_the_one_that_changed(join_node):
    join_node("gpu01")
    join_node("gpu02")
    models(a=2, b=2, c=2)
    reconcile_all()
    reconcile_all()  # the first round's own placements are read once more
    idle = reconcile_all()
    assert (idle.worked, idle.passed) == (0, 3)
    Model.objects.filter(name="b").update(replicas=3)
    changed = reconcile_all()
    assert (changed.worked, changed.passed, changed.placed) == (1, 2, 1)
    assert [placed("a"), placed("b"), placed("c")] == [2, 3, 2]


def test_a_waiting_replica_rests_until_the_cluster_moves_and_a_node_joining_places_it(join_node):
    join_node("gpu01", gpus=2)
    Model.objects.create(name="big", replicas=2, gpus=2, cpu_cores=1)
    reconcile_all()
    reconcile_all()
    assert placed("big") == 1
    assert reconcile_all().worked == 0  # nothing fits, and nothing moved: not tried again
    join_node("gpu02", gpus=2)  # (in-process, the join's own reconcile)
    reconcile_all()
    assert placed("big") == 2


def test_a_named_reconcile_works_on_the_named_model_whatever_its_digest(join_node):
    join_node("gpu01")
    models(a=1)
    reconcile_all()
    reconcile_all()
    assert reconcile_all(model_names=["a"]).worked == 1


def test_a_model_past_its_time_budget_is_skipped_with_why_and_the_others_are_placed(join_node, capsys):
    from llmgw.ctl import main as ctl

    now = [0.0]

    def slow(node, request):
        # A rule that takes long for one model (as a plugin's lookup may): its plans, on the test's clock.
        if request.model == "b-slow":
            now[0] += 30.0
        return None

    join_node("gpu01")
    models(**{"a": 2, "b-slow": 2, "c": 2})
    REGISTRY.add_filter(Filter("slow", slow))
    try:
        run = reconcile_all(clock=lambda: now[0], budget=5.0)
    finally:
        REGISTRY.remove_external()
    assert run.skipped == 1
    assert [placed("a"), placed("b-slow"), placed("c")] == [2, 0, 2]
    why = Model.objects.get(name="b-slow").error
    assert why == (
        "skipped this round: its reconcile took 30.0 s, past its 5.0 s budget (LLMGW_RECONCILE_MODEL_BUDGET);"
        " what waits is tried again in the next round"
    )
    assert ctl(["models"]) == 0
    assert "b-slow: reconcile failed at" in capsys.readouterr().out
    # The next round, in time: it is placed and the mark cleared.
    reconcile_all(clock=lambda: now[0], budget=5.0)
    assert placed("b-slow") == 2 and Model.objects.get(name="b-slow").error == ""


def test_a_model_past_its_budget_goes_after_the_others_next_round(join_node):
    now = [0.0]
    order: list[str] = []

    def seen(node, request):
        if not order or order[-1] != request.model:
            order.append(request.model)
        if request.model == "a-slow":
            now[0] += 30.0
        return None

    join_node("gpu01")
    models(**{"a-slow": 1, "b": 1})
    REGISTRY.add_filter(Filter("seen", seen))
    try:
        reconcile_all(clock=lambda: now[0], budget=5.0)
        assert placed("b") == 1
        Model.objects.filter(name="b").update(replicas=2)
        order.clear()
        reconcile_all(clock=lambda: now[0], budget=5.0)
    finally:
        REGISTRY.remove_external()
    assert order[:2] == ["b", "a-slow"]
