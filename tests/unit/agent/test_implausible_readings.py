"""Readings beyond what a node's inventory can draw (agents.node.protocol.implausible_readings): dropped,
each named by its field; the rest of the sensors kept as they were."""

from __future__ import annotations

import pytest

from agents.node.protocol import READING_MARGIN, READING_SLACK_WATTS, implausible_readings, validate_heartbeat


def heartbeat(*, cards: int = 8, limit: float | None = 700, readings: list[float | None] | None = None,
              cpu: float | None = 220, **gpu_extra) -> dict:
    inventory = [{"index": i, **({"power_limit_watts": limit} if limit is not None else {})} for i in range(cards)]
    readings = [300.0] * cards if readings is None else readings
    gpus = [
        {"index": i, "temperature_celsius": 60.0, **({"power_watts": w} if w is not None else {}), **gpu_extra}
        for i, w in enumerate(readings)
    ]
    sensors = {"gpus": gpus, "cpu_temperature_celsius": 55.0, **({"cpu_power_watts": cpu} if cpu is not None else {})}
    return validate_heartbeat({"node": "gpu01", "inventory": {"gpus": inventory}, "sensors": sensors})


def check(hb: dict, *, gpu_watts: float | None = 700, node_watts: float | None = 350):
    return implausible_readings(hb, gpu_watts=gpu_watts, node_watts=node_watts)


def test_readings_a_node_can_draw_are_kept_as_they_are():
    hb = heartbeat(readings=[700.0] * 8, cpu=400)
    sensors, dropped = check(hb)
    assert dropped == []
    assert sensors is hb["sensors"]


def test_a_card_just_over_its_limit_is_believed_up_to_the_margin():
    believed = 700 * READING_MARGIN + READING_SLACK_WATTS  # 925 W
    assert check(heartbeat(readings=[believed] + [300.0] * 7))[1] == []
    sensors, dropped = check(heartbeat(readings=[believed + 1] + [300.0] * 7))
    assert dropped == [
        "sensors.gpus[0].power_watts: 926 W is more than GPU 0 can draw (its limit is 700 W; up to 925 W is "
        "believed); dropped"
    ]
    assert "power_watts" not in sensors["gpus"][0]
    assert sensors["gpus"][0]["temperature_celsius"] == 60.0  # the card's other readings are kept
    assert [g["power_watts"] for g in sensors["gpus"][1:]] == [300.0] * 7
    assert sensors["cpu_power_watts"] == 220


def test_sixty_four_cards_at_5_kw_on_a_node_of_eight_are_all_dropped_each_named():
    hb = heartbeat(cards=8, readings=[5000.0] * 64)
    sensors, dropped = check(hb)
    assert len(dropped) == 64
    assert dropped[0].startswith("sensors.gpus[0].power_watts: 5000 W is more than GPU 0 can draw")
    assert dropped[8] == "sensors.gpus[8].power_watts: 5000 W from GPU 8, which the inventory does not list; dropped"
    assert dropped[63].startswith("sensors.gpus[63].power_watts: ")
    assert not any("power_watts" in g for g in sensors["gpus"])
    assert len(sensors["gpus"]) == 64 and sensors["cpu_power_watts"] == 220
    assert hb["sensors"]["gpus"][0]["power_watts"] == 5000.0  # the heartbeat itself is not changed


def test_cpus_drawing_more_than_the_node_can_are_dropped_naming_the_field():
    # 8 × 700 W of cards and 350 W of its own: up to 2 × 5,950 + 50 = 11,950 W is believed of the node.
    assert check(heartbeat(readings=[700.0] * 8, cpu=6000))[1] == []
    sensors, dropped = check(heartbeat(readings=[700.0] * 8, cpu=7000))
    assert dropped == [
        "sensors.cpu_power_watts: 7000 W puts the node at 12600 W, more than it can draw (5600 W of its cards' "
        "limits, 350 W of its own; up to 11950 W is believed); dropped"
    ]
    assert "cpu_power_watts" not in sensors
    assert sensors["cpu_temperature_celsius"] == 55.0
    assert [g["power_watts"] for g in sensors["gpus"]] == [700.0] * 8


def test_a_cpu_node_is_judged_by_its_own_draw():
    assert check(heartbeat(cards=0, readings=[], cpu=750))[1] == []
    sensors, dropped = check(heartbeat(cards=0, readings=[], cpu=20000))
    assert [line.split(":")[0] for line in dropped] == ["sensors.cpu_power_watts"]
    assert "cpu_power_watts" not in sensors


def test_a_bmc_figure_past_what_the_node_can_draw_goes_with_its_source():
    hb = heartbeat(cpu=None)
    hb["sensors"].update({"node_power_watts": 10200.0, "power_source": "bmc", "bmc": {"state": "up"}})
    assert check(hb)[1] == []  # an HGX board at full load: more than its cards and node_watts, still believed
    hb["sensors"]["node_power_watts"] = 320_000.0
    sensors, dropped = check(hb)
    assert dropped == [
        "sensors.node_power_watts: 320000 W is more than the node can draw (5600 W of its cards' limits, 350 W "
        "of its own; up to 11950 W is believed); dropped"
    ]
    assert "node_power_watts" not in sensors and "power_source" not in sensors
    assert sensors["bmc"] == {"state": "up"} and len(sensors["gpus"]) == 8


def test_a_card_without_a_limit_is_judged_by_the_facilitys_figure_or_not_at_all():
    hb = heartbeat(limit=None, readings=[1000.0] * 8)
    assert [line.split(":")[0] for line in check(hb, gpu_watts=700)[1]] == [
        f"sensors.gpus[{i}].power_watts" for i in range(8)
    ]
    # Nobody knows the card's limit: its reading and the node's total are not judged (missing data never blocks).
    assert check(hb, gpu_watts=None) == (hb["sensors"], [])


def test_without_the_nodes_own_figure_only_the_cards_are_judged():
    assert check(heartbeat(cpu=20000), node_watts=None)[1] == []
    assert len(check(heartbeat(readings=[5000.0] * 8), node_watts=None)[1]) == 8


def test_a_capped_card_is_believed_up_to_its_default_limit():
    # Capped from 700 W to 400 W a moment ago: the inventory says 400 W, the card still reads 700 W.
    hb = heartbeat(limit=400, readings=[700.0] * 8, default_power_limit_watts=700.0)
    assert check(hb)[1] == []
    assert len(check(heartbeat(limit=400, readings=[700.0] * 8))[1]) == 8


@pytest.mark.parametrize("readings", [[None] * 8, []])
def test_absent_readings_are_absent_not_judged(readings):
    hb = heartbeat(readings=readings, cpu=None)
    assert check(hb) == (hb["sensors"], [])


def test_a_heartbeat_without_sensors_has_nothing_dropped():
    hb = validate_heartbeat({"node": "gpu01"})
    assert check(hb) == ({}, [])
