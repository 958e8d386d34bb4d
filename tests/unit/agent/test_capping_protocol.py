"""The capping block of the heartbeat answer, the new sensor keys, and the agent applying the answer."""

from __future__ import annotations

import logging

import pytest

from agents.node.config import parse_config
from agents.node.daemon import Agent
from agents.node.protocol import (
    Capping,
    GpuCap,
    HeartbeatError,
    capping_answer,
    validate_capping,
    validate_heartbeat,
)
from tests.fakes.control_plane import REPLICA, ControlPlane, agent_yaml


def test_a_power_limit_block_with_all_and_per_gpu_values():
    block = {
        "lever": "power_limit",
        "all": {"power_limit_watts": 490},
        "gpus": [{"uuid": "GPU-a", "power_limit_watts": 450.5}],
    }
    capping = validate_capping(block)
    assert capping == Capping("power_limit", GpuCap(power_limit_watts=490.0), {"GPU-a": GpuCap(power_limit_watts=450.5)})
    assert capping.for_gpu("GPU-a").power_limit_watts == 450.5
    assert capping.for_gpu("GPU-b").power_limit_watts == 490.0
    assert validate_capping(capping_answer(capping)) == capping


def test_a_clock_block_and_a_gpu_left_out_holds_its_defaults():
    capping = validate_capping({"lever": "locked_clocks", "gpus": [{"uuid": "GPU-a", "locked_clocks_mhz": [900, 1400]}]})
    assert capping.for_gpu("GPU-a") == GpuCap(locked_clocks_mhz=(900, 1400))
    assert capping.for_gpu("GPU-b") is None
    assert capping_answer(capping) == {"lever": "locked_clocks", "gpus": [{"uuid": "GPU-a", "locked_clocks_mhz": [900, 1400]}]}


def test_no_block_means_defaults():
    assert validate_capping(None) is None
    assert capping_answer(None) is None


@pytest.mark.parametrize(
    ("block", "field"),
    [
        ([], "capping"),
        ({"all": {"power_limit_watts": 400}}, "capping.lever"),
        ({"lever": "voltage"}, "capping.lever"),
        ({"lever": "power_limit", "all": {"power_limit_watts": 0}}, "capping.all.power_limit_watts"),
        ({"lever": "power_limit", "all": {"power_limit_watts": 490_000}}, "capping.all.power_limit_watts"),
        ({"lever": "power_limit", "all": {"locked_clocks_mhz": [1, 2]}}, "capping.all.locked_clocks_mhz"),
        ({"lever": "power_limit", "all": {}}, "capping.all.power_limit_watts"),
        ({"lever": "locked_clocks", "all": {"locked_clocks_mhz": [1400, 900]}}, "capping.all.locked_clocks_mhz"),
        ({"lever": "locked_clocks", "all": {"locked_clocks_mhz": [900]}}, "capping.all.locked_clocks_mhz"),
        ({"lever": "locked_clocks", "all": {"locked_clocks_mhz": [900, 1_400_000]}}, "capping.all.locked_clocks_mhz[1]"),
        ({"lever": "locked_clocks", "all": {"locked_clocks_mhz": [900.5, 1400]}}, "capping.all.locked_clocks_mhz[0]"),
        ({"lever": "power_limit", "gpus": [{"power_limit_watts": 400}]}, "capping.gpus[0].uuid"),
        (
            {"lever": "power_limit", "gpus": [{"uuid": "G", "power_limit_watts": 400}, {"uuid": "G", "power_limit_watts": 300}]},
            "capping.gpus[1].uuid",
        ),
        ({"lever": "power_limit", "floor": 0.7}, "capping.floor"),
    ],
)
def test_a_block_that_breaks_the_protocol_is_refused_naming_its_field(block, field):
    with pytest.raises(HeartbeatError) as caught:
        validate_capping(block)
    assert caught.value.field == field


def test_the_heartbeat_takes_the_capping_sensor_keys_and_replica_throughput():
    heartbeat = validate_heartbeat(
        {
            "node": "gpu01",
            "sensors": {
                "gpus": [
                    {
                        "index": 0,
                        "enforced_power_limit_watts": 490.0,
                        "default_power_limit_watts": 700.0,
                        "max_sm_clock_mhz": 1980,
                        "locked_clocks_mhz": [900, 1400],
                        "capping": "not permitted",
                    }
                ],
                "replicas": [{"id": 17, "tokens_per_second": 2310.5}, {"id": 18}],
            },
        }
    )
    assert heartbeat["sensors"]["gpus"][0]["capping"] == "not permitted"
    assert heartbeat["sensors"]["gpus"][0]["locked_clocks_mhz"] == [900, 1400]
    assert heartbeat["sensors"]["gpus"][0]["max_sm_clock_mhz"] == 1980
    assert heartbeat["sensors"]["replicas"] == [{"id": 17, "tokens_per_second": 2310.5}, {"id": 18}]


@pytest.mark.parametrize(
    ("sensors", "field"),
    [
        ({"gpus": [{"index": 0, "capping": "denied"}]}, "sensors.gpus[0].capping"),
        ({"gpus": [{"index": 0, "locked_clocks_mhz": [900]}]}, "sensors.gpus[0].locked_clocks_mhz"),
        ({"gpus": [{"index": 0, "max_sm_clock_mhz": 1_980_000}]}, "sensors.gpus[0].max_sm_clock_mhz"),
        ({"gpus": [{"index": 0, "max_sm_clock_mhz": 0}]}, "sensors.gpus[0].max_sm_clock_mhz"),
        ({"gpus": [{"index": 0, "max_sm_clock_mhz": 1980.5}]}, "sensors.gpus[0].max_sm_clock_mhz"),
        ({"replicas": [{"id": 17}, {"id": 17}]}, "sensors.replicas[1].id"),
        ({"replicas": [{"tokens_per_second": 3}]}, "sensors.replicas[0].id"),
        ({"replicas": [{"id": 17, "watts": 3}]}, "sensors.replicas[0].watts"),
    ],
)
def test_bad_capping_sensors_are_refused_naming_the_field(sensors, field):
    with pytest.raises(HeartbeatError) as caught:
        validate_heartbeat({"node": "gpu01", "sensors": sensors})
    assert caught.value.field == field


@pytest.mark.parametrize(
    ("sensors", "field"),
    [
        ({"gpus": [{"index": 0, "enforced_power_limit_watts": 490_000}]}, "sensors.gpus[0].enforced_power_limit_watts"),
        ({"replicas": [{"id": 17, "tokens_per_second": -1}]}, "sensors.replicas[0].tokens_per_second"),
    ],
)
def test_capping_readings_no_sensor_gives_are_dropped_naming_the_field(sensors, field):
    heartbeat = validate_heartbeat({"node": "gpu01", "sensors": sensors})
    assert [entry["reading"] for entry in heartbeat["sensors"]["implausible"]] == [field]


class CappingReader:
    """A sensor reader that records the capping blocks the agent hands it."""

    def __init__(self) -> None:
        self.applied: list[Capping | None] = []

    def inventory(self) -> dict:
        return {}

    def read(self) -> dict:
        return {}

    def apply_capping(self, capping: Capping | None) -> bool:
        self.applied.append(capping)
        return True

    def close(self) -> None:
        pass


class NoRuntime:
    def sync(self, assigned: list[dict]) -> None:
        pass

    def states(self) -> list[dict]:
        return []

    def throughput(self) -> list[dict]:
        return [{"id": 17, "tokens_per_second": 1200.0}]


@pytest.fixture
def plane():
    control_plane = ControlPlane()
    yield control_plane
    control_plane.close()


def test_the_agent_applies_each_answers_capping_and_defaults_when_it_has_none(plane):
    reader = CappingReader()
    agent = Agent(parse_config(agent_yaml(plane.url)), reader, NoRuntime())
    plane.answer = {"node": "gpu01", "interval_seconds": 10, "replicas": [REPLICA],
                    "capping": {"lever": "power_limit", "all": {"power_limit_watts": 490}}}
    agent.beat()
    plane.answer = {"node": "gpu01", "interval_seconds": 10, "replicas": [REPLICA]}
    agent.beat()
    agent.close()
    assert reader.applied == [Capping("power_limit", GpuCap(power_limit_watts=490.0)), None]
    # Tokens per second go out in the sensors, not in the replica states.
    assert plane.requests[0]["body"]["sensors"]["replicas"] == [{"id": 17, "tokens_per_second": 1200.0}]


def test_a_bad_capping_block_changes_nothing_and_is_said_once(plane, caplog):
    caplog.set_level(logging.ERROR, logger="llmgw.agent")
    reader = CappingReader()
    agent = Agent(parse_config(agent_yaml(plane.url)), reader, NoRuntime())
    plane.answer = {"node": "gpu01", "interval_seconds": 10, "replicas": [], "capping": {"lever": "volts"}}
    agent.beat()
    agent.beat()
    agent.close()
    assert reader.applied == []
    assert [m for m in caplog.messages if "capping" in m] == [
        "heartbeat answer: capping.lever: must be one of power_limit, locked_clocks, not 'volts'; GPU capping unchanged"
    ]
