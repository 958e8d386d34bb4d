"""Tokens per watt: measured per model × GPU model, shown, and preferred among otherwise equal candidates."""

from __future__ import annotations

import pytest
from django.utils import timezone

from agents.models import Node
from placement import snapshot
from placement.index import PlacementIndex
from placement.models import Model, ModelEfficiency, Replica
from placement.planner import plan_replica
from placement.selectors import model_rows
from placement.services import models_apply
from placement.throughput import efficiency_record

pytestmark = pytest.mark.django_db

H100 = "NVIDIA H100 80GB HBM3"
H200 = "NVIDIA H200"


def two_kinds(join_node) -> None:
    # a-h100 sorts first by name: only the efficiency weight puts the replica on b-h200.
    join_node("a-h100", rack="r1", gpu_model=H100)
    join_node("b-h200", rack="r2", gpu_model=H200)
    models_apply(text="kind: Model\nname: m\nreplicas: 0\nprofile: {gpus: 8}\n")


def test_reported_tokens_and_power_become_tokens_per_joule_per_gpu_model(join_node, capsys):
    two_kinds(join_node)
    models_apply(text="kind: Model\nname: m\nreplicas: 2\nprofile: {gpus: 8}\n")
    from placement.reconcile import reconcile_all

    reconcile_all()
    replicas = {r.shards.get().node.name: r for r in Replica.objects.all()}
    Replica.objects.update(state="ready", ready_since=timezone.now())
    for name, watts, tps in (("a-h100", 300.0, 4800.0), ("b-h200", 250.0, 6000.0)):
        node = Node.objects.get(name=name)
        node.sensors = {
            "gpus": [{"index": i, "power_watts": watts} for i in range(8)],
            "replicas": [{"id": replicas[name].pk, "tokens_per_second": tps}],
        }
        node.save(update_fields=["sensors"])
    assert efficiency_record() == 2
    rows = {e.gpu_model: (e.tokens_per_second, e.watts, e.tokens_per_joule) for e in ModelEfficiency.objects.all()}
    assert rows == {"H100": (4800.0, 2400.0, 2.0), "H200": (6000.0, 2000.0, 3.0)}
    shown = model_rows()[0]["efficiency"]
    assert [(e["gpu_model"], e["tokens_per_joule"]) for e in shown] == [("H200", 3.0), ("H100", 2.0)]
    from llmgw.ctl import main as ctl

    assert ctl(["models", "-o", "wide"]) == 0  # tok/s is the wide table's
    assert "H200 3.00 tok/J 6,000 tok/s · H100 2.00 tok/J 4,800 tok/s" in capsys.readouterr().out


def test_the_console_writes_large_figures_with_thousands_separators_as_ctl_does(join_node, admin_client):
    two_kinds(join_node)
    models_apply(text="kind: Model\nname: m\nreplicas: 1\nprofile: {gpus: 8, power_watts: 5600}\n")
    from placement.reconcile import reconcile_all

    reconcile_all()
    replica = Replica.objects.get()
    node = replica.shards.get().node
    now = timezone.now()
    ModelEfficiency.objects.create(model=replica.model, gpu_model="H200", replicas=1, tokens_per_second=14072.4,
                                   watts=4800, tokens_per_joule=2.93, measured_at=now)
    node.sensors = {"gpus": [{"index": i, "power_watts": 600.0} for i in range(8)]}
    node.sensors_at = now
    node.save(update_fields=["sensors", "sensors_at"])
    models = admin_client.get("/models/").content.decode()
    assert "H200 2.93 tokens/J (14,072 tokens/s)" in models
    nodes = admin_client.get("/nodes/").content.decode()
    assert "4,800 W" in nodes  # its GPUs' draw together
    page = admin_client.get(f"/nodes/{node.name}/").content.decode()
    assert "5,600 W" in page  # the replica's booked draw


def test_a_node_naming_another_nodes_replica_in_its_heartbeat_moves_no_figure(join_node):
    # A node's token writes only its node: what it says of a replica running elsewhere is not heard.
    two_kinds(join_node)
    models_apply(text="kind: Model\nname: m\nreplicas: 2\nprofile: {gpus: 8}\n")
    from placement.reconcile import reconcile_all

    reconcile_all()
    replicas = {r.shards.get().node.name: r for r in Replica.objects.all()}
    Replica.objects.update(state="ready", ready_since=timezone.now())
    reports = {
        "a-h100": [{"id": replicas["a-h100"].pk, "tokens_per_second": 4800.0},
                   {"id": replicas["b-h200"].pk, "tokens_per_second": 1e8}],
        "b-h200": [{"id": replicas["b-h200"].pk, "tokens_per_second": 6000.0}],
    }
    for name, watts in (("a-h100", 300.0), ("b-h200", 250.0)):
        node = Node.objects.get(name=name)
        node.sensors = {"gpus": [{"index": i, "power_watts": watts} for i in range(8)], "replicas": reports[name]}
        node.save(update_fields=["sensors"])
    assert efficiency_record() == 2
    rows = {e.gpu_model: (e.tokens_per_second, e.tokens_per_joule) for e in ModelEfficiency.objects.all()}
    assert rows == {"H100": (4800.0, 2.0), "H200": (6000.0, 3.0)}
    # Only its own node's word: the replica on b-h200 has no figure once b-h200 reports none.
    node = Node.objects.get(name="b-h200")
    node.sensors = {**node.sensors, "replicas": []}
    node.save(update_fields=["sensors"])
    ModelEfficiency.objects.all().delete()
    assert efficiency_record() == 1
    assert list(ModelEfficiency.objects.values_list("gpu_model", flat=True)) == ["H100"]


def test_the_gpu_model_with_more_tokens_per_joule_goes_first_in_planner_and_index_alike(join_node):
    two_kinds(join_node)
    model = Model.objects.get()
    request = snapshot.replica_request(model)
    nodes = snapshot.node_views()
    facility = snapshot.facility_view()
    assert sorted(plan_replica(request, nodes, facility).nodes) == ["a-h100"]  # by name, nothing measured
    now = timezone.now()
    ModelEfficiency.objects.create(model=model, gpu_model="H100", replicas=1, tokens_per_second=4800, watts=2400,
                                   tokens_per_joule=2.0, measured_at=now)
    ModelEfficiency.objects.create(model=model, gpu_model="H200", replicas=1, tokens_per_second=6000, watts=2000,
                                   tokens_per_joule=3.0, measured_at=now)
    request = snapshot.replica_request(model)
    assert sorted(plan_replica(request, nodes, facility).nodes) == ["b-h200"]
    assert sorted(PlacementIndex(nodes, facility).plan(request).nodes) == ["b-h200"]
