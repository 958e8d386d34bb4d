"""The guarded commit judges each chosen node on its locked row as it is: a node relabelled between the
plan and the commit (its selector label, or a plugin's label) is a lost race in the filter's own words,
and the replica goes to the next node, through reconcile's own path."""

from __future__ import annotations

import pytest

from agents import services as node_services
from placement import services
from placement.index import PlacementIndex
from placement.models import Replica
from placement.plugins import REGISTRY, plugins_load

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _only_builtins():
    REGISTRY.remove_external()
    yield
    REGISTRY.remove_external()


def relabel_after_the_first_plan(monkeypatch, changes: dict[str, str | None]) -> list[str]:
    """Once reconcile made its first plan to commit, relabel the node it chose (committed, as another
    request would). A plan made before (the apply's preview) is left alone."""
    from placement import reconcile, tasks

    plan, lanes_place = PlacementIndex.plan, reconcile.lanes_place
    chosen: list[str] = []
    placing = [False]

    def placing_lanes(**kwargs):
        placing[0] = True
        try:
            return lanes_place(**kwargs)
        finally:
            placing[0] = False

    def plan_then_relabel(self, request, **kwargs):
        result = plan(self, request, **kwargs)
        if placing[0] and not chosen and getattr(result, "shards", None):
            chosen.append(result.shards[0].node)
            # The reconcile it asks for is the next one's (a worker's), not one run inside this plan.
            with monkeypatch.context() as patched:
                patched.setattr(tasks, "request_reconcile", lambda: None)
                node_services.labels_set(node_name=chosen[0], changes=changes)
        return result

    monkeypatch.setattr(PlacementIndex, "plan", plan_then_relabel)
    monkeypatch.setattr(reconcile, "lanes_place", placing_lanes)
    return chosen


def placed(name: str) -> Replica:
    (replica,) = Replica.objects.filter(model__name=name)
    return replica


def test_a_node_relabelled_off_the_selector_before_the_commit_loses_the_race_and_the_replica_goes_on(
    join_node, monkeypatch
):
    join_node("n1", rack="r1", labels={"tier": "gold"})
    join_node("n2", rack="r2", labels={"tier": "gold"})
    chosen = relabel_after_the_first_plan(monkeypatch, {"tier": "silver"})
    services.model_apply(data={
        "kind": "Model", "name": "m", "replicas": 1, "profile": {"gpus": 8, "node_selector": "tier = gold"},
    })
    assert chosen == ["n1"]
    replica = placed("m")
    assert replica.explain["conflicts"] == ["n1: needs tier = gold"]
    assert list(replica.shards.values_list("node__name", flat=True)) == ["n2"]


def test_a_node_labelled_for_other_models_by_a_plugins_label_before_the_commit_loses_the_race(
    join_node, monkeypatch
):
    plugins_load(REGISTRY, ["placement.examples.rack_affinity"], entry_points=False)
    join_node("n1", rack="r1")
    join_node("n2", rack="r2")
    chosen = relabel_after_the_first_plan(monkeypatch, {"affinity.llmgw.io/models": "other"})
    services.model_apply(data={"kind": "Model", "name": "m", "replicas": 1, "profile": {"gpus": 8}})
    assert chosen == ["n1"]
    replica = placed("m")
    assert replica.explain["conflicts"] == ["n1: rack-affinity: kept for other"]
    assert list(replica.shards.values_list("node__name", flat=True)) == ["n2"]


def test_a_node_relabelled_onto_the_selector_keeps_its_place(join_node, monkeypatch):
    """The labels read are the row's effective ones: a store label over the agent's that still meets the
    selector passes, and the GPU attributes derived from the cards stay."""
    join_node("n1", rack="r1", labels={"tier": "gold"})
    join_node("n2", rack="r2")
    relabel_after_the_first_plan(monkeypatch, {"tier": "gold", "team": "a"})
    services.model_apply(data={
        "kind": "Model", "name": "m", "replicas": 1,
        "profile": {"gpus": 8, "node_selector": "tier = gold, gpu.count = 8"},
    })
    replica = placed("m")
    assert replica.explain.get("conflicts", []) == []
    assert list(replica.shards.values_list("node__name", flat=True)) == ["n1"]


def test_a_rule_added_to_the_registry_is_rechecked_on_the_locked_row_and_explained(join_node, monkeypatch):
    """A filter and a scorer registered as one entry each (tests.fakes.rules): the plan ranks the gold node
    first, the commit's re-check asks the filter of the node as relabelled since, and explain says both."""
    from placement import selectors
    from tests.fakes.rules import GOLD_FIRST, QUIET_HOURS

    REGISTRY.call_seconds = 60.0  # the budget is on the wall clock: a loaded machine's pause is no failure here
    REGISTRY.add_filter(QUIET_HOURS)
    REGISTRY.add_scorer(GOLD_FIRST)
    join_node("n1", rack="r1")
    join_node("n2", rack="r2", labels={"tier": "gold"})
    join_node("n3", rack="r3", labels={"tier": "gold"})
    chosen = relabel_after_the_first_plan(monkeypatch, {"quiet": "yes"})
    services.model_apply(data={"kind": "Model", "name": "m", "replicas": 1, "profile": {"gpus": 8}})
    assert chosen == ["n2"]  # gold, before n1's name
    replica = placed("m")
    assert replica.explain["conflicts"] == ["n2: quiet-hours: in its quiet hour"]
    assert list(replica.shards.values_list("node__name", flat=True)) == ["n3"]
    (explained,) = selectors.model_explain("m")["replicas"]
    assert explained["why"].endswith("a gold node (gold-first)")
