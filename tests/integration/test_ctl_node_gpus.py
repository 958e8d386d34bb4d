"""`llmgw ctl node NAME` lists each GPU with the replica on it, named as `ctl replicas` names it."""

from __future__ import annotations

import pytest

from llmgw.ctl import main as ctl
from placement.models import Replica
from placement.reconcile import reconcile_all
from placement.services import models_apply

pytestmark = pytest.mark.django_db


def test_a_nodes_gpus_name_the_replica_on_each(join_node, api, capsys):
    join_node("gpu01", rack="r1", gpus=4)
    models_apply(text="kind: Model\nname: llama\nreplicas: 1\nprofile: {gpus: 2}\n")
    reconcile_all()
    replica = Replica.objects.get()
    name = f"llama#{replica.ordinal}"
    assert ctl(["node", "gpu01"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.split()[:1] in (["0"], ["1"], ["2"], ["3"])]
    assert sorted(row[-1] for row in rows) == sorted([name, name, "free", "free"])
    listed = api.get("/api/v1/nodes/gpu01").json()["gpu_list"]
    assert sorted((g["replica"], g["replica_name"]) for g in listed if g["replica"]) == [(replica.pk, name)] * 2
