"""The simulator: a cluster file's nodes join through the real heartbeat API, sensors follow placed replicas."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command

from agents.models import Node
from agents.simulator.client import run_round
from agents.simulator.cluster import load_cluster
from agents.simulator.nodes import SimNode
from llmgw.errors import InvalidInput

CLUSTER = """\
nodes:
  - name: sim01
    gpus: 8
    gpu_model: H100-SXM5-80GB
    gpu_memory_gib: 80
    gpu_power_limit_watts: 700
    cpu_cores: 96
    memory_gib: 2048
    fabric: ib-a
    labels:
      llmgw.io/rack: r12-07
      llmgw.io/pdu: r12-07-a,r12-07-b
      gpu.model: H100
  - name: sim02
    gpus: 4
    gpu_model: H200-SXM5-141GB
    gpu_memory_gib: 141
    cpu_cores: 64
    memory_gib: 1024
    labels:
      llmgw.io/row: 3
"""


def spec(name="sim01", gpus=8, **extra):
    return {"name": name, "gpus": gpus, "gpu_model": "H100-SXM5-80GB", "gpu_power_limit_watts": 700.0,
            "cpu_cores": 96, "memory_gib": 2048.0, "labels": {}, **extra}


def gpu(heartbeat, index):
    return heartbeat["sensors"]["gpus"][index]


# -- the sensor model and the runtime, without a server ---------------------------------------------------


def test_an_idle_node_reads_idle_values():
    hb = SimNode(spec()).heartbeat(0.0)
    for reading in hb["sensors"]["gpus"]:
        assert 55 <= reading["power_watts"] <= 85
        assert 28 <= reading["temperature_celsius"] <= 36
        assert reading["throttle_reasons"] == []
        assert reading["power_limit_watts"] == 700.0
    assert 18 <= hb["sensors"]["inlet_temperature_celsius"] <= 27
    assert hb["sensors"]["cpu_power_watts"] > 0
    assert hb["replicas"] == []


def test_gpus_of_a_replica_draw_and_heat_as_it_starts_and_serves_and_cool_when_it_stops():
    node = SimNode(spec(), ready_delay=5)
    node.take_answer({"replicas": [{"id": 7, "gpus": [0, 1]}]}, now=0.0)

    starting = node.heartbeat(1.0)
    assert starting["replicas"] == [{"id": 7, "state": "starting"}]
    assert all(150 <= gpu(starting, i)["power_watts"] <= 250 for i in (0, 1))

    ready = node.heartbeat(6.0)
    assert ready["replicas"] == [{"id": 7, "state": "ready"}]
    for i in (0, 1):
        assert 350 <= gpu(ready, i)["power_watts"] <= 650
        assert gpu(ready, i)["temperature_celsius"] > max(gpu(ready, j)["temperature_celsius"] for j in range(2, 8))
    assert all(gpu(ready, i)["power_watts"] < 100 for i in range(2, 8))
    assert ready["sensors"]["cpu_power_watts"] > starting["sensors"]["cpu_power_watts"]

    node.take_answer({"replicas": []}, now=7.0)
    stopping = node.heartbeat(8.0)
    assert stopping["replicas"] == [{"id": 7, "state": "stopping"}]
    assert all(gpu(stopping, i)["power_watts"] < 100 for i in range(8))
    assert node.heartbeat(9.0)["replicas"] == []


def test_a_card_under_a_low_limit_is_held_at_it_and_says_sw_power_cap():
    node = SimNode(spec(gpus=1, gpu_power_limit_watts=300.0), ready_delay=0)
    node.take_answer({"replicas": [{"id": 1, "gpus": [0]}]}, now=0.0)
    reading = gpu(node.heartbeat(1.0), 0)
    assert reading["power_watts"] <= 300.0
    assert reading["throttle_reasons"] == ["sw_power_cap"]


def test_readings_repeat_for_a_seed_and_differ_between_nodes():
    assert SimNode(spec(), seed=3).heartbeat(0.0) == SimNode(spec(), seed=3).heartbeat(0.0)
    a = SimNode(spec("a")).heartbeat(0.0)["sensors"]["gpus"]
    b = SimNode(spec("b")).heartbeat(0.0)["sensors"]["gpus"]
    assert [g["power_watts"] for g in a] != [g["power_watts"] for g in b]


# -- the cluster file -------------------------------------------------------------------------------------


def test_a_cluster_file_reads_into_node_specs():
    specs = load_cluster(CLUSTER)
    assert [s["name"] for s in specs] == ["sim01", "sim02"]
    assert specs[0]["labels"] == {
        "llmgw.io/rack": "r12-07", "llmgw.io/pdu": "r12-07-a,r12-07-b", "gpu.model": "H100",
    }
    assert specs[1]["labels"] == {"llmgw.io/row": "3"}
    assert specs[1]["gpu_memory_gib"] == 141.0
    assert "gpu_max_sm_clock_mhz" not in specs[0]
    a100 = load_cluster(CLUSTER.replace("    gpu_memory_gib: 141\n", "    gpu_memory_gib: 80\n    gpu_max_sm_clock_mhz: 1410\n"))
    assert a100[1]["gpu_max_sm_clock_mhz"] == 1410


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("    gpus: 4\n", "    gpus: four\n",
         "cluster.yaml line 15: nodes[1].gpus: must be a whole number from 0 to 64, not 'four'"),
        ("    cpu_cores: 64\n", "    cpu_cores: 64\n    gpu_count: 4\n",
         "cluster.yaml line 19: nodes[1].gpu_count: unknown key; a node takes: name, gpus, gpu_model, "
         "gpu_memory_gib, gpu_power_limit_watts, gpu_max_sm_clock_mhz, cpu_cores, memory_gib, fabric, labels"),
        ("      llmgw.io/rack: r12-07\n", "      llmgw.io/rak: r12-07\n",
         "cluster.yaml line 11: nodes[0].labels.llmgw.io/rak: unknown label key 'llmgw.io/rak': the llmgw.io/ "
         "keys are llmgw.io/site, llmgw.io/room, llmgw.io/row, llmgw.io/rack, llmgw.io/pdu, llmgw.io/leg"),
        ("  - name: sim02\n", "  - name: sim01\n", "cluster.yaml line 14: nodes[1].name: sim01 is declared twice "
         "in this file"),
        ("    gpu_power_limit_watts: 700\n", "    gpu_power_limit_watts: -700\n",
         "cluster.yaml line 6: nodes[0].gpu_power_limit_watts: must be a number from 1 to 5000, not -700"),
        ("    gpu_power_limit_watts: 700\n", "    gpu_power_limit_watts: 700\n    gpu_max_sm_clock_mhz: 1410.5\n",
         "cluster.yaml line 7: nodes[0].gpu_max_sm_clock_mhz: must be a whole number from 1 to 10000 (MHz), not 1410.5"),
    ],
)
def test_a_bad_cluster_file_names_the_line_and_the_field(old, new, message):
    assert old in CLUSTER
    with pytest.raises(InvalidInput) as caught:
        load_cluster(CLUSTER.replace(old, new, 1))
    assert caught.value.message == message


@pytest.mark.django_db
def test_sim_up_refuses_a_bad_file_with_its_line_and_field(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER.replace("    gpus: 4\n", "    gpus: four\n"))
    with pytest.raises(CommandError) as caught:
        call_command("sim", "up", "-f", str(path), "--once")
    assert str(caught.value) == "cluster.yaml line 15: nodes[1].gpus: must be a whole number from 0 to 64, not 'four'"
    assert not Node.objects.exists()


def _help(capsys, *argv: str) -> str:
    from llmgw.cli import main

    with pytest.raises(SystemExit) as done:
        main(list(argv))
    assert done.value.code == 0
    return capsys.readouterr().out


def test_each_sim_subcommand_has_its_own_options_and_help(capsys):
    facility = _help(capsys, "sim", "facility", "--help")
    assert facility.startswith("usage: llmgw sim facility [-h] [-f FILE] [--speed SPEED] [scenario]\n")
    assert not {"--once", "--tokens", "--no-capping-permission", "--server"} & set(facility.split())
    up = _help(capsys, "sim", "up", "--help")
    assert up.startswith("usage: llmgw sim up [-h] -f FILE [--once] [--server SERVER]")
    assert "--speed" not in up and "--no-capping-permission" in up
    assert _help(capsys, "sim", "--help").startswith("usage: llmgw sim [-h] {up,facility} ...\n")
    from llmgw.cli import main

    assert main(["--help"]) == 0
    assert (
        "  sim             simulated agents for a cluster file's nodes (llmgw sim up -f cluster.yaml), or a facility\n"
        "                  scenario replayed into the simulated source (llmgw sim facility -f SCENARIO --speed N)\n"
    ) in capsys.readouterr().out


def test_an_option_of_the_other_subcommand_is_refused_with_this_ones_usage(capsys):
    from django.core.management import execute_from_command_line

    with pytest.raises(SystemExit) as done:
        execute_from_command_line(["llmgw", "sim", "facility", "-f", "s.yaml", "--once"])
    assert done.value.code == 2
    assert capsys.readouterr().err == (
        "usage: llmgw sim facility [-h] [-f FILE] [--speed SPEED] [scenario]\n"
        "llmgw sim facility: error: unrecognized arguments: --once\n"
    )


# -- against a live server --------------------------------------------------------------------------------


def test_sim_once_joins_the_nodes_with_their_labels_and_gpus(live_server, tmp_path, capsys):
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER)
    call_command("sim", "up", "-f", str(path), "--once", "--server", live_server.url)
    assert capsys.readouterr().out.strip() == f"sent 2 heartbeats to {live_server.url}: 2 ok"

    sim01 = Node.objects.get(name="sim01")
    assert sim01.labels == {"llmgw.io/rack": "r12-07", "llmgw.io/pdu": "r12-07-a,r12-07-b", "gpu.model": "H100"}
    assert sim01.fabric == "ib-a"
    assert sim01.cpu_cores == 96
    assert sorted(sim01.domains.values_list("domain", flat=True)) == ["pdu:r12-07-a", "pdu:r12-07-b", "rack:r12-07"]
    assert list(sim01.gpus.values_list("index", "uuid", "model", "power_limit_watts")) == [
        (i, f"GPU-sim-sim01-{i}", "H100-SXM5-80GB", 700.0) for i in range(8)
    ]
    assert len(sim01.sensors["gpus"]) == 8
    assert sim01.measured_watts > 0
    sim02 = Node.objects.get(name="sim02")
    assert sim02.labels == {"llmgw.io/row": "3"}
    assert sim02.gpus.count() == 4


def test_sim_once_with_a_wrong_token_fails_saying_why(live_server, tmp_path, capsys):
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER)
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"sim01": "node_wrong", "sim02": "node_wrong"}))
    with pytest.raises(CommandError) as caught:
        call_command("sim", "up", "-f", str(path), "--once", "--server", live_server.url, "--tokens", str(tokens))
    assert str(caught.value) == "2 of 2 heartbeats failed"
    assert "sim01: HTTP 401: unknown node token" in capsys.readouterr().err
    assert not Node.objects.exists()


def test_a_placed_replica_is_reported_ready_and_its_gpus_draw(live_server):
    from agents.services import node_token_create
    from placement.models import GpuBooking, Model, Replica, Shard
    from placement.signals import placement_changed

    nodes = [SimNode(spec("sim01"), ready_delay=0)]
    tokens = {"sim01": node_token_create(node_name="sim01")}
    assert all(r.ok for r in run_round(nodes, tokens, live_server.url))
    node = Node.objects.get(name="sim01")
    model = Model.objects.create(name="llama-70b", replicas=1, gpus=2, command="serve")
    replica = Replica.objects.create(model=model, ordinal=0, state="placed")
    shard = Shard.objects.create(replica=replica, node=node, gpu_indices=[2, 3])
    GpuBooking.objects.bulk_create([GpuBooking(shard=shard, node=node, index=i) for i in (2, 3)])
    # Written here past placement's services: say so as they do, so the heartbeat reads assignments again.
    placement_changed.send(sender=Shard)

    assert all(r.ok for r in run_round(nodes, tokens, live_server.url))  # the answer assigns the replica
    assert all(r.ok for r in run_round(nodes, tokens, live_server.url))  # which now runs, ready

    shard.refresh_from_db()
    assert shard.state == "ready"
    gpus = Node.objects.get(name="sim01").sensors["gpus"]
    assert all(350 <= gpus[i]["power_watts"] <= 650 for i in (2, 3))
    assert all(gpus[i]["power_watts"] < 100 for i in (0, 1, 4, 5, 6, 7))


@pytest.mark.django_db(transaction=True)
def test_a_token_made_for_a_simulated_node_is_handed_to_its_simulator(live_server, settings, tmp_path, capsys):
    """`llmgw ctl node token gpu01` on the demo: the demo's simulator takes the new token and the node
    keeps heartbeating (it was refused from then on)."""
    from agents.services import node_token_create
    from agents.simulator.tokens import KeptTokens, tokens_path, tokens_write
    from llmgw.ctl import main as ctl

    settings.DATA_DIR = tmp_path
    path = tokens_path(tmp_path)
    tokens_write(path, {name: node_token_create(node_name=name) for name in ("sim01", "sim02")})
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    kept = KeptTokens(path)
    nodes = [SimNode(spec("sim01"), ready_delay=0), SimNode(spec("sim02"), ready_delay=0)]
    old = dict(kept)
    assert all(r.ok for r in run_round(nodes, kept, live_server.url))

    assert ctl(["node", "token", "sim01"]) == 0
    new = capsys.readouterr().out.strip()
    assert dict(kept) == {**old, "sim01": new}
    assert [r.ok for r in run_round(nodes, old, live_server.url)] == [False, True]  # the old token is refused
    assert all(r.ok for r in run_round(nodes, kept, live_server.url))

    # A node the simulator does not run is handed nothing.
    assert ctl(["node", "token", "gpu01"]) == 0
    assert set(kept) == {"sim01", "sim02"}
