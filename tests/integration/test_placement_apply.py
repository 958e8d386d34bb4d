"""Models applied from YAML (ctl) and JSON (API): placement on apply, refusals naming the field, scaling, delete."""

from __future__ import annotations

import json
import textwrap

import pytest

from llmgw.ctl import main as ctl
from placement.models import GpuBooking, Model, NodeBooking, Replica, Shard

pytestmark = pytest.mark.django_db(transaction=True)

MODELS = textwrap.dedent(
    """\
    kind: Model
    name: llama-70b
    replicas: 2
    profile:
      gpus: 8
      cpu_cores: 16
      memory_gib: 256
      node_selector: "gpu.model in (H100,H200), gpu.memory_gib >= 80, !spot"
      command: "vllm serve {model} --port {port}"
    ---
    kind: Model
    name: embed
    replicas: 1
    profile:
      gpus: 0
      cpu_cores: 8
      memory_gib: 16
    """
)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = ctl(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path, text: str, name: str = "models.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_apply_places_the_replicas_before_it_returns(capsys, tmp_path, join_node):
    join_node("gpu01", rack="r1")
    join_node("gpu02", rack="r2")
    path = write(tmp_path, MODELS)
    code, out, err = run(capsys, "apply", "-f", str(path))
    assert (code, err) == (0, "")
    assert out.splitlines() == ["model llama-70b created: 2 placed", "model embed created: 1 placed"]
    code, out, _ = run(capsys, "replicas")
    assert out.splitlines() == [
        "MODEL      REPLICA  STATE   NODES       REASON",
        "embed      #1       placed  gpu01       -",
        "llama-70b  #1       placed  gpu01[0-7]  -",
        "llama-70b  #2       placed  gpu02[0-7]  -",
    ]
    code, out, _ = run(capsys, "models")  # 120 columns: the profile cut short, -o wide has it whole
    assert out.splitlines() == [
        "NAME       PLACED/WANTED  READY  PENDING  CLASS     MIN  TOKENS/J  PROFILE",
        "embed      1/1            0      0        standard  1    -         CPU × 1 node, 8 cores, 16 GiB",
        "llama-70b  2/2            0      0        standard  1    -         8 GPUs × 1 node, 16 cores, 256 GiB; gpu.model in (H1…",
    ]
    code, out, _ = run(capsys, "models", "-o", "wide")
    assert out.splitlines()[2].endswith("8 GPUs × 1 node, 16 cores, 256 GiB; gpu.model in (H100,H200), gpu.memory_gib >= 80, !spot")
    booking = NodeBooking.objects.get(node__name="gpu01")
    assert (booking.cpu_cores, booking.memory_gib) == (24, 272)
    # Applying the same file again changes nothing.
    code, out, _ = run(capsys, "apply", "-f", str(path))
    assert out.splitlines() == ["model llama-70b unchanged: 2 placed", "model embed unchanged: 1 placed"]
    assert Shard.objects.count() == 3


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "kind: Modle\nname: a\nprofile: {gpus: 1}\n",
            "line 1: kind: unknown kind 'Modle'; llmgw ctl apply takes kind: Model",
        ),
        ("name: a\nprofile: {gpus: 1}\n", "line 1: kind: required; write kind: Model"),
        (
            "kind: Model\nname: a\nreplica: 2\nprofile: {gpus: 1}\n",
            "line 3: replica: unknown key; a Model takes: kind, name, replicas, class, min_ready, profile",
        ),
        (
            "kind: Model\nname: a\nreplicas: 2\nclass: gold\nprofile: {gpus: 1}\n",
            "line 4: class: must be one of critical, standard, batch, not 'gold'",
        ),
        (
            "kind: Model\nname: a\nreplicas: 2\nmin_ready: 3\nprofile: {gpus: 1}\n",
            "line 4: min_ready: must be at most replicas (2) (got 3)",
        ),
        (
            "kind: Model\nname: a\nreplicas: -1\nprofile: {gpus: 1}\n",
            "line 3: replicas: must not be negative (got -1)",
        ),
        (
            "kind: Model\nname: a\nprofile:\n  gpus: 1\n  nodes: 0\n",
            "line 5: profile.nodes: must be at least 1 (got 0)",
        ),
        (
            "kind: Model\nname: a\nprofile:\n  gpus: 8\n  gpu: 1\n",
            "line 5: profile.gpu: unknown key; a profile takes: gpus, nodes, cpu_cores, memory_gib, power_watts, "
            "keep_within, node_selector, topology, command, health_path, min_ready_seconds",
        ),
        (
            "kind: Model\nname: a\nprofile:\n  gpus: 8\n  keep_within: pdu\n",
            "line 5: profile.keep_within: must be one of rack, row, room, site, not 'pdu'",
        ),
        (
            "kind: Model\nname: a\nprofile:\n  gpus: 4\n  topology: nvlink\n",
            "line 5: profile.topology: must be one of any, nvlink-all, same-numa, not 'nvlink'",
        ),
        (
            "kind: Model\nname: a\nprofile:\n  gpus: 8\n  node_selector: 'gpu.model in H100'\n",
            "line 5: profile.node_selector 'gpu.model in H100': expected '(' after 'in', found 'H' at column 14",
        ),
        (
            "kind: Model\nname: a\nprofile:\n  gpus: eight\n",
            "line 4: profile.gpus: must be a whole number, not 'eight'",
        ),
        (
            "kind: Model\nname: a b\nprofile: {gpus: 1}\n",
            "line 2: name: 'a b' is not a model name (letters, digits, '.', '_' and '-', at most 200)",
        ),
    ],
)
def test_a_bad_document_is_refused_naming_the_line_and_field(capsys, tmp_path, text, message):
    path = write(tmp_path, text)
    code, out, err = run(capsys, "apply", "-f", str(path))
    assert (code, out) == (1, "")
    assert err == f"error: {path} {message}\n"
    assert not Model.objects.exists()


def test_one_bad_document_refuses_the_whole_file(capsys, tmp_path):
    path = write(tmp_path, MODELS + "---\nkind: Model\nname: bad\nprofile:\n  gpus: -8\n")
    code, _, err = run(capsys, "apply", "-f", str(path))
    assert code == 1
    assert err == f"error: {path} line 22: profile.gpus: must not be negative (got -8)\n"
    assert not Model.objects.exists()
    path = write(tmp_path, MODELS + "---\n" + MODELS.split("---\n")[1])
    code, _, err = run(capsys, "apply", "-f", str(path))
    assert err == f"error: {path} line 20: name: 'embed' is already in document 2 of this file\n"


def test_a_profile_change_says_the_placed_replicas_keep_the_old_one(capsys, tmp_path, join_node, api):
    join_node("gpu01", rack="r1")
    join_node("gpu02", rack="r2")
    assert run(capsys, "apply", "-f", str(write(tmp_path, MODELS)))[0] == 0
    changed = MODELS.replace("cpu_cores: 16\n", "cpu_cores: 5000\n", 1).replace("gpus: 8", "gpus: 4", 1).replace(
        "vllm serve {model}", "vllm serve {model} --quantization fp8", 1
    )
    code, out, _ = run(capsys, "apply", "-f", str(write(tmp_path, changed)))
    kept = (
        "profile.gpus, profile.cpu_cores changed: its 2 placed replicas keep what they were placed with "
        "(GPUs, cores, memory, booked power); replicas placed from now on take the new profile; "
        "profile.command changed: its 2 placed replicas restart with it at their nodes' next heartbeat, all at once"
    )
    assert code == 0
    assert out.splitlines() == [
        "model llama-70b updated: 2 placed", f"warning: llama-70b: {kept}", "model embed unchanged: 1 placed",
    ]
    doc = {"kind": "Model", "name": "embed", "replicas": 1, "profile": {"gpus": 0, "cpu_cores": 8, "power_watts": 400}}
    answer = api.post("/api/v1/models", doc, format="json").json()
    assert answer["warning"] == (
        "profile.memory_gib, profile.power_watts changed: its 1 placed replica keeps what it was placed with "
        "(GPUs, cores, memory, booked power); replicas placed from now on take the new profile"
    )
    assert api.post("/api/v1/models", doc, format="json").json()["warning"] is None  # nothing changed


def test_scale_down_removes_the_newest_and_frees_its_gpus(capsys, tmp_path, join_node):
    for name in ("gpu01", "gpu02", "gpu03"):
        join_node(name, rack=f"r-{name}")
    path = write(tmp_path, "kind: Model\nname: m\nreplicas: 3\nprofile: {gpus: 4, cpu_cores: 4}\n")
    run(capsys, "apply", "-f", str(path))
    ordinals = {r.ordinal: r.pk for r in Replica.objects.all()}
    assert sorted(ordinals) == [1, 2, 3]
    path.write_text("kind: Model\nname: m\nreplicas: 1\nprofile: {gpus: 4, cpu_cores: 4}\n")
    code, out, _ = run(capsys, "apply", "-f", str(path))
    assert out == "model m updated: 1 placed\n"
    assert list(Replica.objects.values_list("ordinal", flat=True)) == [1]
    assert GpuBooking.objects.count() == 4
    assert sum(NodeBooking.objects.values_list("cpu_cores", flat=True)) == 4


def test_delete_model_frees_everything(capsys, tmp_path, join_node):
    join_node("gpu01")
    run(
        capsys,
        "apply",
        "-f",
        str(write(tmp_path, "kind: Model\nname: m\nreplicas: 2\nprofile: {gpus: 4, cpu_cores: 8}\n")),
    )
    code, out, _ = run(capsys, "delete", "model", "m")
    assert out == "model m deleted (2 replicas removed)\n"
    assert not GpuBooking.objects.exists()
    booking = NodeBooking.objects.get(node__name="gpu01")
    assert (booking.cpu_cores, booking.placed_watts) == (0, 0)
    code, _, err = run(capsys, "delete", "model", "m")
    assert (code, err) == (1, "error: model 'm' is not known\n")


def test_api_applies_json_documents_and_refuses_naming_the_field(api, viewer_api, join_node):
    join_node("gpu01")
    doc = {"kind": "Model", "name": "m", "replicas": 1, "profile": {"gpus": 2}}
    response = api.post("/api/v1/models", doc, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["action"], body["replicas"]["placed"]) == ("created", 1)
    assert body["replica_list"][0]["shards"][0]["gpus"] == [0, 1]

    bad = {**doc, "profile": {"gpus": 2, "keep_within": "aisle"}}
    response = api.post("/api/v1/models", bad, format="json")
    assert response.status_code == 400
    assert response.json() == {
        "detail": "profile.keep_within: must be one of rack, row, room, site, not 'aisle'",
        "field": "profile.keep_within",
    }
    response = api.post(
        "/api/v1/models", {**doc, "profile": {"gpus": 1, "node_selector": "a >= x"}}, format="json"
    )
    assert (
        response.json()["detail"]
        == "profile.node_selector 'a >= x': '>=' compares numbers, and 'x' is not one at column 3"
    )

    assert viewer_api.post("/api/v1/models", doc, format="json").status_code == 403
    assert viewer_api.get("/api/v1/models").json()[0]["name"] == "m"
    assert viewer_api.get("/api/v1/replicas?model=m").json()[0]["nodes"] == ["gpu01"]
    assert viewer_api.get("/api/v1/models/nope").status_code == 404
    response = api.delete("/api/v1/models/m")
    assert (response.status_code, response.json()) == (200, {"name": "m", "replicas_removed": 1})
    assert not GpuBooking.objects.exists()


def test_models_json_output(capsys, tmp_path, join_node):
    join_node("gpu01")
    run(capsys, "apply", "-f", str(write(tmp_path, MODELS)))
    _, out, _ = run(capsys, "models", "-o", "json")
    data = {m["name"]: m for m in json.loads(out)}
    assert data["llama-70b"]["replicas"] == {"desired": 2, "placed": 1, "ready": 0, "pending": 1, "failed": 0,
                                              "unreachable": 0}
    assert (
        data["llama-70b"]["profile"]["node_selector"]
        == "gpu.model in (H100,H200), gpu.memory_gib >= 80, !spot"
    )


def test_class_and_min_ready_are_kept_and_shown(admin_client):
    from placement.selectors import model_rows
    from placement.services import models_apply

    models_apply(text="kind: Model\nname: batchy\nreplicas: 3\nclass: batch\nmin_ready: 2\nprofile: {gpus: 0}\n")
    models_apply(text="kind: Model\nname: none\nreplicas: 0\nprofile: {gpus: 0}\n")
    rows = {r["name"]: r for r in model_rows()}
    assert (rows["batchy"]["class"], rows["batchy"]["min_ready"]) == ("batch", 2)
    assert (rows["none"]["class"], rows["none"]["min_ready"]) == ("standard", 0)
    page = admin_client.get("/models/").content.decode()
    assert "min ready 2" in page and ">batch<" in page


def test_a_placement_names_the_nodes_it_gave_shards_so_the_heartbeat_map_reads_only_those(
    capsys, tmp_path, join_node
):
    from placement.signals import placement_changed

    for i in range(1, 5):
        join_node(f"gpu0{i}", rack=f"r{i}")
    heard: list[list[str] | None] = []

    def hear(*, nodes=None, **_):
        heard.append(nodes)

    placement_changed.connect(hear, dispatch_uid="test-named-nodes")
    try:
        code, _, err = run(capsys, "apply", "-f", str(write(tmp_path, MODELS.replace("replicas: 2", "replicas: 3"))))
    finally:
        placement_changed.disconnect(dispatch_uid="test-named-nodes")
    assert (code, err) == (0, "")
    placed = set(Shard.objects.values_list("node__name", flat=True))
    assert len(placed) == 3
    # The model's own change is news for every node (sent without names); each placement names its nodes.
    named = [nodes for nodes in heard if nodes is not None]
    assert named and set().union(*named) == placed
