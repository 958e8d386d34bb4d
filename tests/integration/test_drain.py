"""Holds that drain: replicas move out one at a time per model, the replacement up first."""

from __future__ import annotations

import textwrap

import pytest

from agents.models import Node
from agents.services import labels_set
from facility.services import hold_create, hold_release
from placement.drain import drain_progress, replicas_split
from placement.models import Model, Replica, Shard
from placement.reconcile import reconcile_all
from placement.selectors import facility_overview, models_shown, replica_rows
from placement.services import models_apply
from tests.integration.drive import Cluster, ready_counts

pytestmark = pytest.mark.django_db


def apply(name: str, replicas: int, gpus: int = 4, min_ready: int = 0) -> None:
    models_apply(
        text=textwrap.dedent(
            f"""\
            kind: Model
            name: {name}
            replicas: {replicas}
            profile:
              gpus: {gpus}
              min_ready_seconds: {min_ready}
              command: "serve {{model}} --port {{port}}"
            """
        )
    )
    reconcile_all()


def shards_in(rack: str) -> int:
    return Shard.objects.filter(node__domains__domain=f"rack:{rack}").count()


def run_until_ready(cluster: Cluster, expected: dict[str, int], ticks: int = 20) -> None:
    for _ in range(ticks):
        cluster.tick()
        if all(ready_counts()[m] >= n for m, n in expected.items()):
            return
    raise AssertionError(f"not ready: {ready_counts()} (wanted {expected})")


def test_a_drain_moves_every_replica_out_and_no_model_drops_below_its_ready_count():
    cluster = Cluster({"r1": 2, "r2": 2, "r3": 2, "r4": 2})
    cluster.tick()
    for name, count in (("llama", 3), ("mistral", 3), ("qwen", 3)):
        apply(name, count)
    run_until_ready(cluster, {"llama": 3, "mistral": 3, "qwen": 3})
    assert shards_in("r1") > 0

    hold_create(domain="rack:r1", reason="PDU swap", drain=True)
    lowest = dict(ready_counts())
    for _ in range(60):
        cluster.tick()
        counts = ready_counts()
        for model in ("llama", "mistral", "qwen"):
            lowest[model] = min(lowest[model], counts[model])
        if shards_in("r1") == 0 and all(counts[m] == 3 for m in ("llama", "mistral", "qwen")):
            break
    assert shards_in("r1") == 0
    assert lowest == {"llama": 3, "mistral": 3, "qwen": 3}
    assert Replica.objects.count() == 9
    assert not Replica.objects.filter(replaces__isnull=False).exists()
    assert drain_progress()["rack:r1"].left == 0


def test_a_replacement_is_placed_before_the_old_replica_stops():
    cluster = Cluster({"r1": 1, "r2": 1})
    cluster.tick()
    apply("llama", 1, gpus=8)
    run_until_ready(cluster, {"llama": 1})
    old = Replica.objects.get()
    rack = Shard.objects.get(replica=old).node.labels["llmgw.io/rack"]

    hold_create(domain=f"rack:{rack}", reason="PDU swap", drain=True)
    cluster.tick(0)
    replacement = Replica.objects.get(replaces=old)
    assert Replica.objects.filter(pk=old.pk).exists()  # still running while its replacement starts
    assert replacement.state in ("placed", "starting")
    # The listing says why the old one is going: the hold that drains its node.
    reasons = {row["id"]: row["reason"] for row in replica_rows()}
    assert reasons[old.pk] == f"rack {rack} is held with drain: to be replaced, the replacement up first"
    run_until_ready(cluster, {"llama": 1})
    for _ in range(5):
        cluster.tick()
    assert not Replica.objects.filter(pk=old.pk).exists()
    assert Replica.objects.get().pk == replacement.pk


def test_a_drain_that_cannot_place_a_replacement_says_why_and_completes_when_a_node_is_added(admin_client, capsys):
    cluster = Cluster({"r1": 1, "r2": 1})
    cluster.tick()
    apply("llama", 2, gpus=8)
    run_until_ready(cluster, {"llama": 2})

    hold_create(domain="rack:r1", reason="PDU swap", drain=True)
    for _ in range(3):
        cluster.tick()
    progress = drain_progress()["rack:r1"]
    assert (progress.left, progress.moving) == (1, 0)
    assert progress.blocked == [
        {"replica": progress.blocked[0]["replica"],
         "reason": "no node fits (2 nodes): 1 × gpu: 8 requested, 0 free; 1 × rack r1 is held: PDU swap"}
    ]
    assert ready_counts()["llama"] == 2  # the old replica stays
    rack = next(d for d in facility_overview()["domains"] if d["domain"] == "rack:r1")
    assert rack["hold"]["drain_progress"] == progress.as_dict()
    assert rack["hold"]["drain_text"] == (
        "1 left, 0 moving, 1 blocked: no node fits (2 nodes): 1 × gpu: 8 requested, 0 free; "
        "1 × rack r1 is held: PDU swap"
    )
    page = admin_client.get("/facility/").content.decode()
    assert "1 left, 0 moving, 1 blocked" in page
    from llmgw.ctl import main as ctl

    ctl(["facility", "-o", "wide"])  # the hold's whole text: the wide table (the default cuts it to 120 columns)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("rack:r1 "))
    assert ("held (drain: 1 left, 0 moving, 1 blocked: no node fits (2 nodes): 1 × gpu: 8 requested, "
            "0 free; 1 × rack r1 is held: PDU swap): PDU swap  ") in line

    cluster.add("n-r3-0", "r3")
    for _ in range(10):
        cluster.tick()
    assert shards_in("r1") == 0
    assert ready_counts()["llama"] == 2
    assert drain_progress()["rack:r1"].left == 0


def test_release_mid_drain_stops_it_and_moved_replicas_stay():
    cluster = Cluster({"r1": 2, "r2": 2}, ready_delay=3.0)
    cluster.tick()
    apply("llama", 4, gpus=4)
    run_until_ready(cluster, {"llama": 4})
    before_r1 = shards_in("r1")
    assert before_r1 >= 1

    hold_create(domain="rack:r1", reason="PDU swap", drain=True)
    for _ in range(6):  # a replacement or two through, not all
        cluster.tick()
    moved = before_r1 - shards_in("r1")
    hold_release(domain="rack:r1")
    for _ in range(6):
        cluster.tick()
    assert not Replica.objects.filter(replaces__isnull=False).exists()
    assert Replica.objects.count() == 4
    assert shards_in("r1") == before_r1 - moved
    assert ready_counts()["llama"] == 4


def test_drain_a_single_node_and_uncordon():
    from agents.services import node_cordon

    cluster = Cluster({"r1": 2})
    cluster.tick()
    apply("llama", 2, gpus=4)
    run_until_ready(cluster, {"llama": 2})
    busy = Shard.objects.values_list("node__name", flat=True).first()
    node_cordon(node_name=busy, cordoned=True, drain=True)
    on_it = set(Shard.objects.filter(node__name=busy).values_list("replica_id", flat=True))
    assert {r["reason"] for r in replica_rows() if r["id"] in on_it} == {f"{busy} drains: to be replaced, the replacement up first"}
    for _ in range(10):
        cluster.tick()
    assert not Shard.objects.filter(node__name=busy).exists()
    assert ready_counts()["llama"] == 2
    node_cordon(node_name=busy, cordoned=False)
    assert not Node.objects.get(name=busy).draining


@pytest.mark.parametrize("drained", [("r1", "r2"), ("r2", "r5"), ("r5", "r6")])
def test_after_draining_two_racks_a_models_replicas_sit_at_most_two_per_rack(drained):
    """Spreading counts replicas: with 6 over 6 racks, draining two leaves at most 2 per rack."""
    racks = [f"r{i}" for i in range(1, 7)]
    cluster = Cluster({rack: 3 for rack in racks})
    cluster.tick()
    apply("llama", 6, gpus=8)
    run_until_ready(cluster, {"llama": 6})
    assert [shards_in(rack) for rack in racks] == [1] * 6
    for rack in drained:
        hold_create(domain=f"rack:{rack}", reason="PDU swap", drain=True)
    for _ in range(80):
        cluster.tick()
        if all(shards_in(rack) == 0 for rack in drained) and ready_counts()["llama"] == 6 \
                and Replica.objects.count() == 6:
            break
    per_rack = {rack: shards_in(rack) for rack in racks}
    assert all(per_rack[rack] == 0 for rack in drained), per_rack
    assert max(per_rack.values()) == 2 and sum(per_rack.values()) == 6, per_rack


def test_a_drain_never_takes_a_model_below_its_min_ready():
    """The replacement is up, but another replica failed meanwhile: the old one keeps serving until the
    model has min_ready ready replicas without it."""
    cluster = Cluster({"r1": 1, "r2": 1, "r3": 1})
    cluster.tick()
    models_apply(
        text="kind: Model\nname: llama\nreplicas: 2\nmin_ready: 2\n"
        "profile: {gpus: 8, min_ready_seconds: 0, command: 'serve {model} --port {port}'}\n"
    )
    reconcile_all()
    run_until_ready(cluster, {"llama": 2})
    old = Replica.objects.order_by("ordinal").first()
    other = Replica.objects.exclude(pk=old.pk).get()
    rack = Shard.objects.filter(replica=old).first().node.labels["llmgw.io/rack"]
    hold_create(domain=f"rack:{rack}", reason="PDU swap", drain=True)
    cluster.tick(0)
    replacement = Replica.objects.get(replaces=old)
    cluster.reconcile = False  # the agents report; the reconciles below are the test's own
    for _ in range(10):
        cluster.tick()
        replacement.refresh_from_db()
        if replacement.state == "ready":
            break
    assert replacement.state == "ready"
    # The other replica fails: stopping the old one now would leave 1 ready, under min_ready 2.
    Replica.objects.filter(pk=other.pk).update(state="failed")
    reconcile_all()
    assert Replica.objects.filter(pk=old.pk).exists()
    # Back to 3 ready with the failed one healthy again: the old one may stop.
    Replica.objects.filter(pk=other.pk).update(state="ready")
    reconcile_all()
    assert not Replica.objects.filter(pk=old.pk).exists()


def test_a_replica_a_relabel_split_across_racks_is_replaced_within_one_rack_first(caplog, admin_client):
    """A node of a pair kept within its rack moved rack (a relabel, a NetBox correction): the pair spans
    two racks. It moves as a drained replica does: a replacement within one rack first, then it stops."""
    cluster = Cluster({"r1": 2, "r2": 2})
    cluster.tick()
    models_apply(
        text=textwrap.dedent(
            """\
            kind: Model
            name: pair
            replicas: 1
            profile:
              gpus: 8
              nodes: 2
              keep_within: rack
              min_ready_seconds: 0
              command: "serve {model} --port {port}"
            """
        )
    )
    reconcile_all()
    run_until_ready(cluster, {"pair": 1})
    old = Replica.objects.get()
    nodes = sorted(Shard.objects.filter(replica=old).values_list("node__name", flat=True))
    rack = Node.objects.get(name=nodes[0]).labels["llmgw.io/rack"]
    other = {"r1": "r2", "r2": "r1"}[rack]

    labels_set(node_name=nodes[1], changes={"llmgw.io/rack": other})
    cluster.tick(0)
    replacement = Replica.objects.get(replaces=old)
    assert Replica.objects.filter(pk=old.pk).exists()  # serving while its replacement starts
    assert (
        f"model pair: replica {old.pk} spans rack r1, r2 (keep_within rack): a replacement within one first, "
        "then it stops"
        in caplog.messages
    )
    said = "spans rack r1, r2 (keep_within rack): to be replaced within one"
    assert {r["id"]: r["reason"] for r in replica_rows(model="pair")}[old.pk] == said  # API, ctl
    assert {r["id"]: r["reason"] for r in models_shown(["pair"])["pair"]["replicas"]}[old.pk] == said  # console
    assert said in admin_client.get("/models/pair/").content.decode()
    run_until_ready(cluster, {"pair": 1})
    for _ in range(5):
        cluster.tick()
    assert list(Replica.objects.values_list("pk", flat=True)) == [replacement.pk]
    assert {n.labels["llmgw.io/rack"] for n in Node.objects.filter(shards__replica=replacement)} == {other}
    assert replicas_split(Model.objects.get(name="pair")) == {}


def test_a_split_pair_whose_node_moves_back_keeps_serving_and_its_replacement_goes():
    cluster = Cluster({"r1": 2, "r2": 2}, ready_delay=30)
    cluster.tick()
    models_apply(text="kind: Model\nname: pair\nreplicas: 1\nprofile: {gpus: 8, nodes: 2, keep_within: rack}\n")
    reconcile_all()
    for _ in range(40):
        cluster.tick()
    old = Replica.objects.get()
    node = Shard.objects.filter(replica=old).values_list("node__name", flat=True).first()
    rack = Node.objects.get(name=node).labels["llmgw.io/rack"]
    other = {"r1": "r2", "r2": "r1"}[rack]
    mate = Shard.objects.filter(replica=old).exclude(node__name=node).values_list("node__name", flat=True).get()
    labels_set(node_name=mate, changes={"llmgw.io/rack": other})
    cluster.tick(0)
    assert Replica.objects.filter(replaces=old).exists()
    labels_set(node_name=mate, changes={"llmgw.io/rack": None})  # back where the agent says it is
    cluster.tick(0)
    assert list(Replica.objects.values_list("pk", flat=True)) == [old.pk]


def test_a_drain_of_the_model_goes_before_a_split_pair_and_then_the_pair_is_mended():
    cluster = Cluster({"r1": 2, "r2": 2, "r3": 2, "r4": 2})
    cluster.tick()
    models_apply(text="kind: Model\nname: pair\nreplicas: 2\nprofile: {gpus: 8, nodes: 2, keep_within: rack, min_ready_seconds: 0}\n")
    reconcile_all()
    run_until_ready(cluster, {"pair": 2})
    split, drained = Replica.objects.order_by("ordinal")
    rack_of = {
        r.pk: Node.objects.filter(shards__replica=r).values_list("labels__llmgw.io/rack", flat=True).first()
        for r in (split, drained)
    }
    free = sorted({"r1", "r2", "r3", "r4"} - set(rack_of.values()))
    mover = Shard.objects.filter(replica=split).values_list("node__name", flat=True).first()
    labels_set(node_name=mover, changes={"llmgw.io/rack": free[0]})
    hold_create(domain=f"rack:{rack_of[drained.pk]}", reason="PDU swap", drain=True)
    cluster.tick(0)
    assert list(Replica.objects.exclude(replaces=None).values_list("replaces", flat=True)) == [drained.pk]
    for _ in range(30):
        cluster.tick()
        if not Replica.objects.filter(pk__in=[split.pk, drained.pk]).exists() and ready_counts()["pair"] == 2:
            break
    assert not Replica.objects.filter(pk__in=[split.pk, drained.pk]).exists()
    assert shards_in(rack_of[drained.pk]) == 0
    assert replicas_split(Model.objects.get(name="pair")) == {}


def test_a_pair_on_nodes_without_the_keep_within_label_is_not_split():
    """keep_within set after the pair was placed, on nodes without that label: no replacement could be
    placed either (the planner refuses a node without it), so none is made."""
    cluster = Cluster({"r1": 2})
    cluster.tick()
    models_apply(text="kind: Model\nname: pair\nreplicas: 1\nprofile: {gpus: 8, nodes: 2, keep_within: rack}\n")
    reconcile_all()
    Model.objects.filter(name="pair").update(keep_within="row")
    assert replicas_split(Model.objects.get(name="pair")) == {}
    cluster.tick(0)
    assert not Replica.objects.exclude(replaces=None).exists()


def test_a_pair_whose_node_was_recabled_to_another_fabric_is_replaced_within_one():
    """A multi-node replica stays in one fabric (the planner's rule, with or without keep_within): a node
    of it reported on another fabric (re-cabled) moves it, as a split across racks does."""
    cluster = Cluster({"r1": 4})
    cluster.tick()
    models_apply(text="kind: Model\nname: pair\nreplicas: 1\nprofile: {gpus: 8, nodes: 2, min_ready_seconds: 0}\n")
    reconcile_all()
    run_until_ready(cluster, {"pair": 1})
    old = Replica.objects.get()
    moved = Shard.objects.filter(replica=old).values_list("node__name", flat=True).first()
    Node.objects.filter(name=moved).update(fabric="ib-b")
    assert replicas_split(Model.objects.get(name="pair")) == {old.pk: "fabric ib-a, ib-b"}
    cluster.nodes[moved].spec["fabric"] = "ib-b"  # its agent reports the new fabric from now on
    cluster.tick(0)
    replacement = Replica.objects.get(replaces=old)
    for _ in range(10):
        cluster.tick()
    assert list(Replica.objects.values_list("pk", flat=True)) == [replacement.pk]
    assert set(Node.objects.filter(shards__replica=replacement).values_list("fabric", flat=True)) == {"ib-a"}
