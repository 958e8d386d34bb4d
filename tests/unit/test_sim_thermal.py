"""The simulator's cards in poor airflow pass their slowdown temperature under load and throttle (as a
real card does: clocks down until it holds there), so the demo's throttling panel shows data."""

from __future__ import annotations

import yaml

from agents.node.protocol import validate_heartbeat
from agents.simulator.nodes import THERMAL_SLOWDOWN_CELSIUS, SimNode, airflow_offsets
from tests.conftest import node_spec


def test_a_hot_card_at_full_load_throttles_at_its_slowdown_temperature():
    node = SimNode(node_spec("gpu01", gpus=2), ready_delay=0)
    node.take_answer({"replicas": [{"id": 17, "model": "m", "gpus": [0, 1], "port": 8100}]}, now=0)
    node.heartbeat(now=1)
    node.gpu_airflow = [16.0, 0.0]  # card 0 where the air reaches it warm
    node.gpu_level = [650.0, 650.0]  # both at the top of the loaded band
    gpus = validate_heartbeat(node.heartbeat(now=2))["sensors"]["gpus"]
    hot, cool = gpus
    assert "sw_thermal" in hot["throttle_reasons"] and "sw_thermal" not in cool["throttle_reasons"]
    assert THERMAL_SLOWDOWN_CELSIUS <= hot["temperature_celsius"] < THERMAL_SLOWDOWN_CELSIUS + 3
    assert cool["temperature_celsius"] < THERMAL_SLOWDOWN_CELSIUS
    assert hot["power_watts"] < cool["power_watts"] - 20  # its clocks down: it draws what holds it there


def test_the_demo_has_hot_cards():
    from llmgw.management.commands.demo import DEMO_DIR

    nodes = yaml.safe_load((DEMO_DIR / "cluster.yaml").read_text())["nodes"]
    hot = [n["name"] for n in nodes if any(airflow_offsets(f"0:{n['name']}", n["gpus"]))]
    assert 3 <= len(hot) <= 12

