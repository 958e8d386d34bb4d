"""Facility sources without Django: PromQL answers to readings, scenarios replayed in time."""

from pathlib import Path

import pytest
import yaml

from facility.conditions import INLET, DomainState, evaluate
from facility.domains import Domain
from facility.sources import (
    QuerySignal,
    parse_duration,
    parse_query_signals,
    parse_scenario,
    poll_prometheus,
    readings_from_vector,
)

ROOT = Path(__file__).resolve().parents[2]


def test_durations():
    assert parse_duration("2m") == 120 and parse_duration("1h30m") == 5400 and parse_duration(90) == 90
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
    def get(self, *_a, **_k):
        raise ConnectionRefusedError("connection refused")


def test_a_source_that_is_down_is_a_fact_not_a_crash():
    poll = poll_prometheus("http://127.0.0.1:9", [QuerySignal(INLET, "q", "rack")], client=_Down(), now=0)
    assert not poll.up and poll.readings == {}
    assert poll.errors == ["inlet_temp_c: ConnectionRefusedError: connection refused"]


def test_the_shipped_crac_failure_scenario_warms_then_heats_then_recovers():
    scenario = parse_scenario(yaml.safe_load((ROOT / "deploy/scenarios/crac-failure.yaml").read_text()))
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
