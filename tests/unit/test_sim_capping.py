"""The simulator's throughput model and its GPUs obeying capping answers."""

from __future__ import annotations

from agents.node.protocol import validate_heartbeat
from agents.simulator.nodes import (
    MAX_SM_CLOCK_MHZ,
    SimNode,
    clock_fraction,
    drawn_watts,
    tokens_per_second,
)
from tests.conftest import node_spec

DEMAND = 300.0  # a card in decode wants about this much at the top clock


def figures(*, limit: float = 700.0, locked: int | None = None) -> tuple[float, float]:
    """tokens/s and watts drawn of a card wanting DEMAND under this limit or clock lock."""
    fraction = clock_fraction(demand_watts=DEMAND, limit_watts=limit, locked_max_mhz=locked)
    return tokens_per_second(DEMAND, fraction), drawn_watts(DEMAND, fraction)


def test_decode_is_flat_while_the_cap_is_above_its_draw_then_falls_with_the_clock():
    full, _ = figures()
    assert figures(limit=500)[0] == full == figures(limit=DEMAND)[0]
    lower = [figures(limit=watts)[0] for watts in (250, 200, 150, 100)]
    assert lower == sorted(lower, reverse=True)
    assert lower[0] < full and lower[-1] < 0.7 * full
    for watts in (250, 200, 150):
        assert figures(limit=watts)[1] <= watts + 1e-9  # the draw fits under the cap


def test_a_moderate_clock_lock_costs_few_tokens_and_saves_energy_per_token():
    tokens, watts = figures()
    locked_tokens, locked_watts = figures(locked=int(MAX_SM_CLOCK_MHZ * 0.7))
    assert locked_tokens > 0.9 * tokens
    assert locked_watts / locked_tokens < 0.85 * (watts / tokens)


def test_prefill_share_follows_the_clock():
    # Past the decode knee, what is left of throughput falls in proportion to the clock.
    high = tokens_per_second(DEMAND, 0.5)
    low = tokens_per_second(DEMAND, 0.25)
    assert abs(low / high - 0.5) < 1e-9


def loaded_node(**kwargs) -> SimNode:
    node = SimNode(node_spec("gpu01", rack="r1", pdu="p1", gpus=2), ready_delay=0, **kwargs)
    node.take_answer({"replicas": [{"id": 17, "gpus": [0, 1]}]}, now=0)
    node.heartbeat(now=1)  # the replica is ready from here on
    return node


def test_simulated_gpus_hold_the_wanted_limit_and_report_it():
    node = loaded_node()
    before = validate_heartbeat(node.heartbeat(now=2))
    (replica,) = before["sensors"]["replicas"]
    assert replica["id"] == 17 and replica["tokens_per_second"] > 0
    node.take_answer(
        {"replicas": [{"id": 17, "gpus": [0, 1]}], "capping": {"lever": "power_limit", "all": {"power_limit_watts": 250}}},
        now=3,
    )
    after = validate_heartbeat(node.heartbeat(now=4))
    for gpu in after["sensors"]["gpus"]:
        assert gpu["enforced_power_limit_watts"] == 250.0
        assert gpu["default_power_limit_watts"] == 700.0
        assert gpu["power_watts"] <= 250.0
        assert "sw_power_cap" in gpu["throttle_reasons"]
    assert [g["power_limit_watts"] for g in after["inventory"]["gpus"]] == [250.0, 250.0]
    assert after["sensors"]["replicas"][0]["tokens_per_second"] < replica["tokens_per_second"]
    node.take_answer({"replicas": [{"id": 17, "gpus": [0, 1]}]}, now=5)
    restored = validate_heartbeat(node.heartbeat(now=6))
    assert [g["enforced_power_limit_watts"] for g in restored["sensors"]["gpus"]] == [700.0, 700.0]


def test_simulated_clock_locks_are_reported_and_cut_the_draw():
    node = loaded_node()
    node.take_answer(
        {"replicas": [{"id": 17, "gpus": [0, 1]}], "capping": {"lever": "locked_clocks", "all": {"locked_clocks_mhz": [600, 900]}}},
        now=3,
    )
    after = validate_heartbeat(node.heartbeat(now=4))
    for gpu in after["sensors"]["gpus"]:
        assert gpu["locked_clocks_mhz"] == [600, 900]
        assert gpu["power_watts"] < 350.0  # the loaded band starts at 350 W at the top clock


def test_without_permission_the_gpus_keep_their_defaults_and_say_so():
    node = loaded_node(capping_permitted=False)
    node.take_answer(
        {"replicas": [{"id": 17, "gpus": [0, 1]}], "capping": {"lever": "power_limit", "all": {"power_limit_watts": 250}}},
        now=3,
    )
    after = validate_heartbeat(node.heartbeat(now=4))
    for gpu in after["sensors"]["gpus"]:
        assert gpu["capping"] == "not permitted"
        assert gpu["enforced_power_limit_watts"] == 700.0


def test_simulated_cards_report_their_top_clock_and_hold_a_lock_below_it():
    assert all(g["max_sm_clock_mhz"] == MAX_SM_CLOCK_MHZ for g in loaded_node().heartbeat(now=2)["sensors"]["gpus"])
    node = SimNode(node_spec("gpu01", rack="r1", gpus=2, gpu_max_sm_clock_mhz=1410), ready_delay=0)
    node.take_answer(
        {"replicas": [{"id": 17, "gpus": [0, 1]}], "capping": {"lever": "locked_clocks", "all": {"locked_clocks_mhz": [210, 1584]}}},
        now=0,
    )
    for gpu in validate_heartbeat(node.heartbeat(now=1))["sensors"]["gpus"]:
        assert gpu["max_sm_clock_mhz"] == 1410
        assert gpu["locked_clocks_mhz"] == [210, 1410]  # 80 % of a Hopper's top is no cap on an A100


def test_a_lock_at_the_same_share_of_each_cards_top_slows_each_alike():
    a100 = clock_fraction(demand_watts=DEMAND, limit_watts=700.0, locked_max_mhz=1128, top_mhz=1410)
    l40s = clock_fraction(demand_watts=DEMAND, limit_watts=700.0, locked_max_mhz=2016, top_mhz=2520)
    assert abs(a100 - 0.8) < 1e-9 and abs(l40s - 0.8) < 1e-9
