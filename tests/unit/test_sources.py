"""Facility sources without Django: PromQL answers to readings, scenarios replayed in time."""

from pathlib import Path

import pytest
import yaml

from facility.conditions import COOLING_ALARM as _ALARM
from facility.conditions import INLET, DomainState, Reading, evaluate, parse_conditions_config
from facility.configuration import ConfigError
from facility.domains import Domain
from facility.sources import (
    NodeThermal,
    QuerySignal,
    agents_readings,
    merge_readings,
    node_thermal,
    parse_duration,
    parse_query_signals,
    parse_scenario,
    parse_sources_config,
    poll_prometheus,
    readings_from_vector,
)

ROOT = Path(__file__).resolve().parents[2]


def test_durations():
    assert parse_duration("2m") == 120 and parse_duration("1h30m") == 5400 and parse_duration(90) == 90
    # A bare number as text (a command line's `--for 120`) is seconds too, as the number is.
    assert parse_duration("120") == 120 and parse_duration(" 90.5 ") == 90.5
    for bad in ("", "2 minutes", -1, True, float("nan"), "m"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_query_signals_name_the_key_that_is_wrong():
    ok = parse_query_signals(
        {"inlet_temp_c": {"query": "max by (rack) (x)", "domain_label": "rack", "stale_after": "2m"}}
    )
    assert ok == [QuerySignal("inlet_temp_c", "max by (rack) (x)", "rack", 120.0)]
    with pytest.raises(ValueError, match=r"^inlet_temp_c.domain_label: one of site, room, row, rack, pdu"):
        parse_query_signals({"inlet_temp_c": {"query": "x", "domain_label": "shelf"}})
    with pytest.raises(ValueError, match=r"^humidity: unknown signal"):
        parse_query_signals({"humidity": {"query": "x", "domain_label": "rack"}})
    with pytest.raises(ValueError, match=r"^inlet_temp_c.stale_after: "):
        parse_query_signals({"inlet_temp_c": {"query": "x", "domain_label": "rack", "stale_after": "soon"}})


def test_vector_to_readings_keeps_the_worse_series_and_skips_nan():
    signal = QuerySignal(INLET, "q", "rack", 120)
    result = [
        {"metric": {"rack": "r1"}, "value": [1000.0, "24.5"]},
        {"metric": {"rack": "r1"}, "value": [1000.0, "26.0"]},
        {"metric": {"rack": "r2"}, "value": [1000.0, "NaN"]},
        {"metric": {"room": "x"}, "value": [1000.0, "20"]},
        {"metric": {"rack": "bad name"}, "value": [1000.0, "20"]},
    ]
    found, errors = readings_from_vector(signal, result, now=1000.0)
    assert {d: r.value for d, r in found.items()} == {Domain("rack", "r1"): 26.0}
    assert errors == [
        "inlet_temp_c: a series has no 'rack' label",
        "inlet_temp_c: rack='bad name' is not a domain name",
    ]


class _Down:
    def stream(self, *_a, **_k):
        raise ConnectionRefusedError("connection refused")


def test_a_source_that_is_down_is_a_fact_not_a_crash():
    poll = poll_prometheus("http://127.0.0.1:9", [QuerySignal(INLET, "q", "rack")], client=_Down(), now=0)
    assert not poll.up and poll.readings == {}
    assert poll.errors == ["inlet_temp_c: ConnectionRefusedError: connection refused"]


def test_the_shipped_crac_failure_scenario_warms_then_heats_then_recovers():
    scenario = parse_scenario(yaml.safe_load((ROOT / "llmgw/demo/scenarios/crac-failure.yaml").read_text()))
    assert scenario.name == "crac-failure" and scenario.duration == 50 * 60
    rack = Domain("rack", "r1-01")
    state, seen = DomainState(), []
    for second in range(0, 50 * 60, 15):
        state, change = evaluate(state, scenario.readings_at(second, second)[rack], second)
        if change:
            seen.append((change.after, second // 60))
    assert [c for c, _ in seen] == ["ok", "warm", "hot", "warm", "ok"]
    (_, _), (_, warm), (_, hot), (_, cooler), (_, ok) = seen
    assert 6 <= warm <= 8 and 11 <= hot <= 13 and 32 <= cooler <= 35 and 36 <= ok <= 42, seen
    # The other rows stay ok throughout.
    assert scenario.readings_at(20 * 60, 0)[Domain("rack", "r2-01")][INLET].value < 24
    assert scenario.readings_at(12 * 60, 0)[rack][INLET].value == pytest.approx(34.0)


def test_scenario_errors_name_the_path():
    base = {"name": "s", "tracks": [{"domains": "rack:r1", "signal": INLET, "points": [[0, 20], ["1m", 21]]}]}
    assert parse_scenario(base).tracks[0].value_at(30) == pytest.approx(20.5)
    bad = {**base, "tracks": [{**base["tracks"][0], "points": [[0, 20], ["1m", "hot"]]}]}
    with pytest.raises(ValueError, match=r"^tracks.0.points.1: the value is a number"):
        parse_scenario(bad)
    bad = {**base, "tracks": [{**base["tracks"][0], "points": [["2m", 20], ["1m", 21]]}]}
    with pytest.raises(ValueError, match=r"^tracks.0.points.1: times go forward"):
        parse_scenario(bad)
    bad = {**base, "tracks": [{**base["tracks"][0], "domains": ["shelf:1"]}]}
    with pytest.raises(ValueError, match=r"^tracks.0.domains.0: "):
        parse_scenario(bad)


# --- the agents' source, merging, and server.yaml's blocks ---------------------------------------------

RACK = Domain("rack", "r1")


def _gpu(temp, slowdown=None, reasons=()):
    gpu = {"index": 0, "temperature_celsius": temp, "throttle_reasons": list(reasons)}
    if slowdown is not None:
        gpu["slowdown_temperature_celsius"] = slowdown
    return gpu


def test_agents_readings_take_the_highest_inlet_the_throttling_share_and_the_smallest_margin():
    nodes = [
        node_thermal((RACK,), {"inlet_temperature_celsius": 25.0,
                               "gpus": [_gpu(80, 89), _gpu(60, 89, ["sw_thermal"])]}, 100.0),
        node_thermal((RACK,), {"inlet_temperature_celsius": 28.5,
                               "gpus": [_gpu(70, 87, ["sw_power_cap"]), _gpu(50)]}, 90.0),
        node_thermal((RACK,), {"inlet_temperature_celsius": 40.0, "gpus": [_gpu(99, 89, ["hw_thermal"])]}, 0.0),
    ]
    found = agents_readings(nodes, now=130.0, stale_after=60.0)[RACK]
    assert found["inlet_temp_c"].value == 28.5  # the stale node's 40 °C is left out
    assert found["thermal_throttle_share"].value == 0.25  # 1 of 4 GPUs, power capping is not heat
    assert found["slowdown_margin_c"].value == 9  # 89 − 80
    assert found["thermal_throttle_share"].at == 90.0  # as old as the oldest node it counts


def test_node_thermal_takes_numbers_and_gpu_objects_only():
    got = node_thermal((RACK,), {
        "inlet_temperature_celsius": "31",
        "gpus": [7, None, "gpu", _gpu(True, 87, "hw_thermal"), _gpu(60, 2e9, [["hw_thermal"], "sw_thermal"]),
                 _gpu(80.5, 87, ["HW_THERMAL"])],
    }, 100.0)
    # Three GPUs (the objects); one throttles for heat (a listed reason, not a string); the margin is the
    # one GPU whose two temperatures are figures; text is no inlet.
    assert (got.inlet, got.cards, got.throttling, got.margin) == (None, 3, 1, 6.5)
    for sensors in ([], "x", None, {"gpus": {"temperature_celsius": 90}}):
        assert node_thermal((RACK,), sensors, 1.0) == NodeThermal((RACK,), 1.0)
    assert node_thermal((RACK,), {"inlet_temperature_celsius": -0.0}, 1.0).inlet == 0.0
    assert str(node_thermal((RACK,), {"inlet_temperature_celsius": -0.0}, 1.0).inlet) == "0.0"
    assert node_thermal((RACK,), {"inlet_temperature_celsius": 1e9 + 1}, 1.0).inlet is None


def test_a_node_without_sensors_gives_no_reading_never_a_zero():
    assert agents_readings([node_thermal((RACK,), {}, 100.0)], now=100.0) == {}


def test_merging_sources_keeps_the_worse_fresh_value():
    a = {RACK: {"inlet_temp_c": Reading(25.0, 100.0), "slowdown_margin_c": Reading(9.0, 100.0)}}
    b = {RACK: {"inlet_temp_c": Reading(31.0, 0.0, stale_after=10), "slowdown_margin_c": Reading(4.0, 100.0),
                _ALARM: Reading(1.0, 100.0)}}
    merged = merge_readings(a, b, now=100.0)[RACK]
    assert merged["inlet_temp_c"].value == 25.0  # the 31 °C one is stale
    assert merged["slowdown_margin_c"].value == 4.0
    assert merged[_ALARM].value == 1.0


def test_conditions_config_overrides_a_domain_over_the_cluster():
    config = parse_conditions_config(
        {"mode": "observe", "thresholds": {"hot_inlet_c": 31, "enter_seconds": "1m"},
         "domains": {"rack:r12-07": {"mode": "enforce", "thresholds": {"hot_inlet_c": 30}}}}
    )
    assert config.rule("rack:r1").thresholds.hot_inlet_c == 31 and not config.rule("rack:r1").enforce
    rule = config.rule("rack:r12-07")
    assert rule.enforce and rule.thresholds.hot_inlet_c == 30 and rule.thresholds.enter_seconds == 60


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        ({"mode": "on"}, ("mode",)),
        ({"thresholds": {"warm_inlet": 27}}, ("thresholds", "warm_inlet")),
        ({"thresholds": {"enter_seconds": "soon"}}, ("thresholds", "enter_seconds")),
        ({"domains": {"rack": {}}}, ("domains", "rack")),
        ({"domains": {"rack:r1": {"domains": {}}}}, ("domains", "rack:r1", "domains")),
    ],
)
def test_a_wrong_conditions_block_names_its_path(raw, path):
    with pytest.raises(ConfigError) as caught:
        parse_conditions_config(raw)
    assert caught.value.path == path


def test_sources_config_defaults_to_the_agents_and_reads_each_source():
    assert parse_sources_config(None).agents
    config = parse_sources_config({
        "agents": False,
        "prometheus": {"url": "http://m:9090", "interval": "1m",
                       "signals": {"inlet_temp_c": {"query": "up", "domain_label": "rack"}}},
        "static": {"rack:r1": {"inlet_temp_c": 24}},
        "simulated": {"file": "s.yaml", "speed": 5},
    })
    assert not config.agents and config.prometheus.interval == 60
    assert config.prometheus.signals[0].signal == "inlet_temp_c"
    assert config.static == {RACK: {"inlet_temp_c": 24.0}}
    assert (config.simulated_file, config.simulated_speed) == ("s.yaml", 5.0)
    with pytest.raises(ConfigError) as caught:
        parse_sources_config({"simulated": {"file": "s.yaml", "speed": 0}})
    assert caught.value.path == ("simulated", "speed")
