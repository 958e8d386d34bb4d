"""Placement plugins: a filter and a scorer from another package change placement, appear in explain's
`why:` and rejections, and one that raises is reported and skipped; the index stays equal to the plain
path with them on."""

from __future__ import annotations

import logging

import pytest

from placement import selectors, services
from placement.plugins import REGISTRY, Filter, Scorer, plugins_load

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLE = "placement.examples.rack_affinity"


@pytest.fixture(autouse=True)
def _only_builtins():
    REGISTRY.remove_external()
    yield
    REGISTRY.remove_external()


def cluster(join_node) -> None:
    join_node("n1", rack="r1", labels={"affinity.llmgw.io/models": "other"})
    join_node("n2", rack="r2")
    join_node("n3", rack="r3", labels={"affinity.llmgw.io/models": "m"})


def apply(name: str, replicas: int) -> None:
    services.model_apply(data={"kind": "Model", "name": name, "replicas": replicas, "profile": {"gpus": 8}})


def test_without_the_plugin_the_name_decides(join_node):
    cluster(join_node)
    apply("m", 1)
    assert selectors.replica_rows(model="m")[0]["nodes"] == ["n1"]


def test_a_plugins_filter_and_scorer_change_placement_and_explain(join_node):
    assert plugins_load(REGISTRY, [EXAMPLE], entry_points=False) == [EXAMPLE]
    cluster(join_node)
    apply("m", 1)
    (placed,) = selectors.model_explain("m")["replicas"]
    assert placed["nodes"] == ["n3"]  # kept for m: first, before spreading's tie and the name
    assert placed["why"].endswith("kept for m (rack-affinity)")
    apply("x", 3)  # n1 is kept for another model, n3 for m: one replica of x fits, on n2
    explain = selectors.model_explain("x")
    assert [r["nodes"] for r in explain["replicas"] if r["nodes"]] == [["n2"]]
    pending = [r for r in explain["replicas"] if not r["nodes"]][0]
    assert {"node": "n1", "reason": "rack-affinity: kept for other"} in pending["rejections"]
    assert pending["summary"].startswith("no node fits (3 nodes)")


def test_a_plugin_that_raises_refuses_the_node_and_its_scorer_scores_neutral(join_node, caplog, settings):
    settings.REDIS_URL = ""  # counted in this process (test_plugin_counts_reach_every_process: with Redis)

    def boom(node, request):
        raise ZeroDivisionError("division by zero")

    REGISTRY.add_scorer(Scorer("boom", boom, boom))
    cluster(join_node)
    with caplog.at_level(logging.WARNING, logger="placement.plugins"):
        apply("m", 2)
    assert len([r for r in selectors.replica_rows(model="m") if r["nodes"]]) == 2  # its scorer: 0 for each
    assert REGISTRY.errors[0] == "plugin boom: raised ZeroDivisionError: division by zero"
    assert "plugin boom: raised ZeroDivisionError: division by zero; it scores 0 (neutral)" in caplog.text
    REGISTRY.add_filter(Filter("bust", boom))
    apply("x", 1)  # fail closed: the one node with room, which the filter could not judge, is refused
    (pending,) = selectors.model_explain("x")["replicas"]
    assert pending["nodes"] == []
    assert {"node": "n3", "reason": "plugin bust: raised ZeroDivisionError: division by zero"} in pending["rejections"]
    from placement.metrics import PluginErrorsCollector

    errors, _ = PluginErrorsCollector().collect()
    counted = {tuple(s.labels.values()): s.value for s in errors.samples if s.name == "llmgw_plugin_errors_total"}
    assert counted[("bust", "filter", "raised")] >= 1  # n3, once a plan
    assert counted[("boom", "scorer", "raised")] >= 3


def test_plugin_counts_reach_every_process_through_redis(join_node, settings):
    import os

    import redis

    from placement import explain
    from placement.metrics import PluginErrorsCollector

    url = os.environ.get("LLMGW_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    settings.REDIS_URL = url
    other = redis.Redis.from_url(url)
    other.delete(explain.PLUGIN_COUNTS_KEY)
    explain._redis = None
    try:
        other.hincrby(explain.PLUGIN_COUNTS_KEY, "failed\tboom\tfilter\traised", 5)  # a worker counted these
        REGISTRY.add_filter(Filter("boom", lambda node, request: 1 / 0))
        cluster(join_node)
        apply("m", 1)  # its three nodes refused: sent once the placement is done
        assert other.hget(explain.PLUGIN_COUNTS_KEY, "failed\tboom\tfilter\traised") == b"8"
        errors, _ = PluginErrorsCollector().collect()
        assert [(s.labels, s.value) for s in errors.samples if s.name == "llmgw_plugin_errors_total"] == [
            ({"plugin": "boom", "kind": "filter", "error": "raised"}, 8.0)]
    finally:
        other.delete(explain.PLUGIN_COUNTS_KEY)
        explain._redis = None


def test_plugins_load_from_server_yaml_and_a_bad_one_is_skipped(tmp_path):
    from llmgw.plugin_names import plugins_configured

    text = f"placement:\n  plugins: [{EXAMPLE}, no.such.plugin]\nfacility:\n  margin: 0.1\n"
    names = plugins_configured(text, "server.yaml")
    assert names == [EXAMPLE, "no.such.plugin"]
    assert plugins_load(REGISTRY, names, entry_points=False) == [EXAMPLE]
    assert REGISTRY.errors == ["plugin no.such.plugin: raised ModuleNotFoundError: No module named 'no'"]
    from facility.services import facility_apply
    from llmgw.errors import InvalidInput

    assert facility_apply(text=text)["warnings"] == [
        "placement.plugins: loaded from LLMGW_CONFIG when a server process starts, not by applying it"]
    with pytest.raises(InvalidInput, match=r"server.yaml line 2: placement.plugins\[0\]: 'rm -rf' is not a dotted path"):
        facility_apply(text="placement:\n  plugins: ['rm -rf']\n")


def test_the_index_equals_the_plain_path_with_a_plugin_on(join_node):
    from django.utils import timezone

    from placement import snapshot
    from placement.index import PlacementIndex
    from placement.planner import plan_replica

    plugins_load(REGISTRY, [EXAMPLE], entry_points=False)
    cluster(join_node)
    for i in range(4, 12):
        join_node(f"n{i}", rack=f"r{i % 3}", labels={"affinity.llmgw.io/models": "m"} if i % 2 else {})
    apply("m", 0)
    from placement.models import Model

    request = snapshot.replica_request(Model.objects.get(name="m"))
    views = snapshot.node_views(now=timezone.now())
    facility = snapshot.facility_view()
    assert PlacementIndex(views, facility).plan(request) == plan_replica(request, views, facility)


def test_the_guarded_commit_asks_a_plugins_filter_again_on_the_node_as_it_is_now(join_node, monkeypatch):
    """The plugin turns a node down between the plan and the commit: the commit's re-check runs the same
    filter and the replica goes to the next node, the plugin's words in its conflicts. A filter marked
    not ``rechecked`` is asked at planning only."""
    from placement import snapshot
    from placement.commit import replica_place
    from placement.index import PlacementIndex
    from placement.models import Model, Replica

    closed: set[str] = set()
    phase = ["plan"]
    asked_at_commit: list[str] = []

    def maintenance(node, request):
        return "in a maintenance window" if node.name in closed else None

    def planning_only(node, request):
        if phase[0] == "commit":
            asked_at_commit.append(node.name)
        return None

    REGISTRY.add_filter(Filter("window", maintenance))
    REGISTRY.add_filter(Filter("counted", planning_only, rechecked=False))
    cluster(join_node)
    model = Model.objects.create(name="m", replicas=1, gpus=8)
    replica = Replica.objects.create(model=model, ordinal=1)
    index = PlacementIndex(snapshot.node_views(), snapshot.facility_view())
    plan = PlacementIndex.plan
    chosen: list[str] = []

    def plan_then_close(self, request, **kwargs):
        phase[0] = "plan"
        result = plan(self, request, **kwargs)
        if not chosen:  # the window opens on the first choice once it is planned
            chosen.append(result.shards[0].node)
            closed.add(chosen[0])
        phase[0] = "commit"
        return result

    monkeypatch.setattr(PlacementIndex, "plan", plan_then_close)
    outcome = replica_place(replica=replica, request=snapshot.replica_request(model), index=index)
    assert outcome.plan is not None and chosen[0] not in outcome.plan.nodes
    replica.refresh_from_db()
    assert replica.explain["conflicts"] == [f"{chosen[0]}: window: in a maintenance window"]
    assert asked_at_commit == []


def test_ctl_and_the_api_list_the_rules_and_say_when_a_plugin_sends_plans_the_plain_way(viewer_api, capsys):
    from llmgw.ctl import main as ctl

    assert plugins_load(REGISTRY, [EXAMPLE], entry_points=False) == [EXAMPLE]
    body = viewer_api.get("/api/v1/placement/rules").json()
    assert body["index"] == "kept"
    assert [r["id"] for r in body["rules"] if r["kind"] == "filter"][-2:] == ["rack-affinity", "power"]
    affinity = next(r for r in body["rules"] if r["kind"] == "scorer" and r["id"] == "rack-affinity")
    assert affinity == {"kind": "scorer", "id": "rack-affinity", "order": 25, "builtin": False,
                        "words": "a model prefers the nodes labelled for it", "reads": ["labels"], "rechecked": False}
    REGISTRY.add_scorer(Scorer("coin", lambda node, request: 0))
    assert ctl(["rules"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "index: plain path: scorer coin does not say which of a node's fields it reads"
    assert "scorer  coin" in out
