"""Readings a node cannot have read (agents.node.protocol: the heartbeat's check and implausible_readings):
dropped, each named by its field with its value, why and its kind; the rest of the sensors kept as they were."""

from __future__ import annotations

import math

import pytest

from agents.node.protocol import (
    GPU_READING_TOLERANCE,
    READING_SLACK_WATTS,
    HeartbeatError,
    implausible_readings,
    implausible_text,
    validate_heartbeat,
)


def heartbeat(*, cards: int = 8, limit: float | None = 700, readings: list[float | None] | None = None,
              cpu: float | None = 220, max_draw: float | None = None, **gpu_extra) -> dict:
    inventory = [{"index": i, **({"power_limit_watts": limit} if limit is not None else {})} for i in range(cards)]
    readings = [300.0] * cards if readings is None else readings
    gpus = [
        {"index": i, "temperature_celsius": 60.0, **({"power_watts": w} if w is not None else {}), **gpu_extra}
        for i, w in enumerate(readings)
    ]
    sensors = {"gpus": gpus, "cpu_temperature_celsius": 55.0, **({"cpu_power_watts": cpu} if cpu is not None else {})}
    inv = {"gpus": inventory, **({"max_draw_watts": max_draw} if max_draw is not None else {})}
    return validate_heartbeat({"node": "gpu01", "inventory": inv, "sensors": sensors})


def check(hb: dict, *, gpu_watts: float | None = 700, node_watts: float | None = 350, **kw):
    sensors, dropped = implausible_readings(hb, gpu_watts=gpu_watts, node_watts=node_watts, **kw)
    return sensors, [implausible_text(entry) for entry in dropped]


def test_readings_a_node_can_draw_are_kept_as_they_are():
    hb = heartbeat(readings=[700.0] * 8, cpu=400)
    sensors, dropped = check(hb)
    assert dropped == []
    assert sensors is hb["sensors"]


def test_a_card_just_over_its_limit_is_believed_up_to_the_tolerance():
    believed = 700 * GPU_READING_TOLERANCE + READING_SLACK_WATTS  # 795 W
    assert check(heartbeat(readings=[believed] + [300.0] * 7))[1] == []
    sensors, dropped = check(heartbeat(readings=[925.0] + [300.0] * 7))
    assert dropped == [
        "sensors.gpus[0].power_watts: 925 W is more than GPU 0 can draw (its maximum is 700 W; up to 795 W is "
        "believed); dropped"
    ]
    assert sensors["implausible"] == [{
        "reading": "sensors.gpus[0].power_watts", "value": 925.0, "kind": "gpu_power",
        "why": "925 W is more than GPU 0 can draw (its maximum is 700 W; up to 795 W is believed)",
    }]
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


def test_the_accepted_cards_judge_where_the_heartbeats_inventory_waits_for_an_operator():
    hb = heartbeat(cards=64, readings=[300.0] * 64)
    known = [{"index": i, "power_limit_watts": 700.0} for i in range(8)]
    sensors, dropped = check(hb, known_gpus=known)
    assert len(dropped) == 56
    assert dropped[0] == (
        "sensors.gpus[8].power_watts: 300 W from GPU 8, which the node's accepted inventory does not list; dropped"
    )
    assert sum(g.get("power_watts", 0) for g in sensors["gpus"]) == 2400.0


def test_a_card_whose_uuid_is_not_the_known_ones_counts_nothing():
    hb = validate_heartbeat({
        "node": "gpu01", "inventory": {"gpus": [{"index": 0, "uuid": "GPU-new"}]},
        "sensors": {"gpus": [{"index": 0, "uuid": "GPU-new", "power_watts": 300.0}]},
    })
    _, dropped = check(hb, known_gpus=[{"index": 0, "uuid": "GPU-old", "power_limit_watts": 700.0}])
    assert dropped == [
        "sensors.gpus[0].power_watts: 300 W from GPU 0 (GPU-new), which the node's accepted inventory does not "
        "list; dropped"
    ]


def test_cpus_drawing_more_than_the_node_can_are_dropped_naming_the_field():
    # 8 × 700 W of cards and 350 W of its own, no ceiling declared: up to 2 × 5,950 + 25 = 11,925 W.
    assert check(heartbeat(readings=[700.0] * 8, cpu=6000))[1] == []
    sensors, dropped = check(heartbeat(readings=[700.0] * 8, cpu=7000))
    assert dropped == [
        "sensors.cpu_power_watts: 7000 W puts the node at 12600 W, more than it can draw (5600 W of its cards' "
        "maximums, 350 W of its own; up to 11925 W is believed); dropped"
    ]
    assert "cpu_power_watts" not in sensors
    assert sensors["cpu_temperature_celsius"] == 55.0
    assert [g["power_watts"] for g in sensors["gpus"]] == [700.0] * 8


def test_a_declared_ceiling_judges_the_node_tightly():
    assert check(heartbeat(readings=[700.0] * 8, cpu=5000, max_draw=10_200))[1] == []  # 10,600 W: within 1.05×
    _, dropped = check(heartbeat(readings=[700.0] * 8, cpu=5200, max_draw=10_200))
    assert dropped == [
        "sensors.cpu_power_watts: 5200 W puts the node at 10800 W, more than it can draw (its ceiling is 10200 W; up "
        "to 10710 W is believed); dropped"
    ]
    # The node's own figure (the facility's) wins over its agent's.
    assert check(heartbeat(readings=[700.0] * 8, cpu=5200, max_draw=10_200), max_draw_watts=12_000)[1] == []


def test_a_cpu_node_is_judged_by_its_own_draw():
    assert check(heartbeat(cards=0, readings=[], cpu=725))[1] == []  # 2 × 350 W + 25 W
    sensors, dropped = check(heartbeat(cards=0, readings=[], cpu=20000))
    assert [line.split(":")[0] for line in dropped] == ["sensors.cpu_power_watts"]
    assert "cpu_power_watts" not in sensors


def test_a_bmc_figure_past_what_the_node_can_draw_goes_with_its_source():
    hb = heartbeat(cpu=None)
    hb["sensors"].update({"node_power_watts": 10200.0, "power_source": "bmc", "bmc": {"state": "up"}})
    assert check(hb)[1] == []  # an HGX board at full load, no ceiling declared: believed
    hb["sensors"]["node_power_watts"] = 11_000.0
    sensors, dropped = check(hb, max_draw_watts=10_200)
    assert dropped == [
        "sensors.node_power_watts: 11000 W is more than the node can draw (its ceiling is 10200 W; up to 10710 W "
        "is believed); dropped"
    ]
    assert "node_power_watts" not in sensors and "power_source" not in sensors
    assert sensors["bmc"] == {"state": "up"} and len(sensors["gpus"]) == 8


def test_a_bmc_figure_far_below_the_cards_own_is_dropped_and_the_cards_count():
    hb = heartbeat(cpu=None)  # 8 × 300 W
    hb["sensors"].update({"node_power_watts": 0.0, "power_source": "bmc", "bmc": {"state": "up"}})
    sensors, dropped = check(hb)
    assert dropped == [
        "sensors.node_power_watts: 0 W is less than half of what its cards alone read (2400 W): their readings "
        "count; dropped"
    ]
    assert "node_power_watts" not in sensors and "power_source" not in sensors
    hb["sensors"]["node_power_watts"] = 1200.0  # half: still believed (a BMC that lags the cards)
    assert check(hb)[1] == []


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


def test_a_capped_card_is_believed_up_to_its_default_limit_or_the_top_of_its_range():
    # Capped from 700 W to 400 W a moment ago: the inventory says 400 W, the card still reads 700 W.
    hb = heartbeat(limit=400, readings=[700.0] * 8, default_power_limit_watts=700.0)
    assert check(hb)[1] == []
    assert len(check(heartbeat(limit=400, readings=[700.0] * 8))[1]) == 8
    ranged = validate_heartbeat({
        "node": "gpu01", "inventory": {"gpus": [{"index": 0, "power_limit_watts": 400, "power_limit_max_watts": 700}]},
        "sensors": {"gpus": [{"index": 0, "power_watts": 700.0}]},
    })
    assert check(ranged)[1] == []


@pytest.mark.parametrize("readings", [[None] * 8, []])
def test_absent_readings_are_absent_not_judged(readings):
    hb = heartbeat(readings=readings, cpu=None)
    assert check(hb) == (hb["sensors"], [])


def test_a_heartbeat_without_sensors_has_nothing_dropped():
    hb = validate_heartbeat({"node": "gpu01"})
    assert check(hb) == ({}, [])


# -- numbers no sensor reads: dropped while the heartbeat is checked -----------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("power_watts", 4_294_967, "4,294,967 W is outside what any sensor reads (0 to 5000 W)"),
        ("power_watts", -1, "-1 W is outside what any sensor reads (0 to 5000 W)"),
        ("temperature_celsius", 6553.5, "6553.5 °C is outside what any sensor reads (-40 to 150 °C)"),
        ("power_watts", math.inf, "inf is not a finite number"),
        ("power_watts", 10**400, "an integer of 401 digits W is outside what any sensor reads (0 to 5000 W)"),
    ],
)
def test_a_number_no_sensor_reads_is_dropped_not_the_heartbeat(field, value, why):
    hb = validate_heartbeat({
        "node": "gpu01", "labels": {"team": "red"},
        "sensors": {"gpus": [{"index": 0, "temperature_celsius": 60.0, "power_watts": 300.0, field: value}]},
    })
    assert hb["labels"] == {"team": "red"}
    assert field not in hb["sensors"]["gpus"][0]
    [entry] = hb["sensors"]["implausible"]
    assert entry == {
        "reading": f"sensors.gpus[0].{field}", "value": None if field == "power_watts" and value in (math.inf, 10**400)
        else float(value), "why": why, "kind": "out_of_bounds",
    }
    # Kept first by the judgement of what the node can draw.
    _, dropped = check(hb)
    assert dropped[0] == f"sensors.gpus[0].{field}: {why}; dropped"


def test_a_bmc_figure_no_bmc_reads_goes_with_its_source():
    hb = validate_heartbeat({
        "node": "gpu01", "sensors": {"node_power_watts": 300_000.0, "power_source": "bmc", "bmc": {"state": "up"}}
    })
    assert "node_power_watts" not in hb["sensors"] and "power_source" not in hb["sensors"]
    assert hb["sensors"]["implausible"][0]["reading"] == "sensors.node_power_watts"


@pytest.mark.parametrize("value", ["300", True, [300], {"w": 300}])
def test_a_reading_of_the_wrong_type_still_refuses_the_heartbeat(value):
    with pytest.raises(HeartbeatError) as exc:
        validate_heartbeat({"node": "gpu01", "sensors": {"gpus": [{"index": 0, "power_watts": value}]}})
    assert exc.value.field == "sensors.gpus[0].power_watts"


def test_a_heartbeat_cannot_say_its_own_readings_are_implausible():
    with pytest.raises(HeartbeatError) as exc:
        validate_heartbeat({"node": "gpu01", "sensors": {"implausible": []}})
    assert exc.value.field == "sensors.implausible"


# -- readings the agent dropped at the source ---------------------------------------------------------------

SENTINEL = {"reading": "power_watts", "value": 4294967.295, "why": "0xFFFFFFFF mW, NVML's not-available value"}


def test_a_reading_the_agent_dropped_flags_the_node_as_one_dropped_here_would():
    hb = validate_heartbeat({
        "node": "gpu01",
        "inventory": {"gpus": [{"index": 0, "power_limit_watts": 700}, {"index": 1, "power_limit_watts": 700}]},
        "sensors": {"gpus": [{"index": 0, "power_watts": 300.0}, {"index": 1, "temperature_celsius": 61.0,
                                                                    "dropped": [SENTINEL]}]},
    })
    assert hb["sensors"]["gpus"][1] == {"index": 1, "temperature_celsius": 61.0}  # carries none of it
    assert hb["sensors"]["implausible"] == [{
        "reading": "sensors.gpus[1].power_watts", "value": 4294967.295,
        "why": "0xFFFFFFFF mW, NVML's not-available value", "kind": "at_source",
    }]
    sensors, dropped = check(hb)
    assert dropped == ["sensors.gpus[1].power_watts: 0xFFFFFFFF mW, NVML's not-available value; dropped"]
    assert sensors["gpus"][0]["power_watts"] == 300.0


def test_a_value_the_agent_could_not_show_is_none():
    entry = {"reading": "temperature_celsius", "why": "no reading"}
    hb = validate_heartbeat({"node": "gpu01", "sensors": {"gpus": [{"index": 0, "dropped": [entry]}]}})
    assert hb["sensors"]["implausible"][0]["value"] is None


@pytest.mark.parametrize(
    ("entry", "field", "message"),
    [
        ("power_watts", "sensors.gpus[0].dropped[0]", "must be an object"),
        ({**SENTINEL, "reading": "fan_rpm"}, "sensors.gpus[0].dropped[0].reading",
         "must be one of default_power_limit_watts, enforced_power_limit_watts, memory_temperature_celsius, "
         "power_limit_watts, power_watts, slowdown_temperature_celsius, temperature_celsius, not 'fan_rpm'"),
        ({"reading": "power_watts"}, "sensors.gpus[0].dropped[0].why", "is required"),
        ({**SENTINEL, "value": "4294967"}, "sensors.gpus[0].dropped[0].value", "must be a number, not '4294967'"),
        ({**SENTINEL, "kind": "at_source"}, "sensors.gpus[0].dropped[0].kind",
         "unknown field; sensors.gpus[0].dropped[0] takes reading, value, why"),
        ({**SENTINEL, "why": "x" * 201}, "sensors.gpus[0].dropped[0].why", "at most 200 characters, got 201"),
    ],
)
def test_a_malformed_dropped_entry_refuses_the_heartbeat_naming_the_field(entry, field, message):
    with pytest.raises(HeartbeatError) as exc:
        validate_heartbeat({"node": "gpu01", "sensors": {"gpus": [{"index": 0, "dropped": [entry]}]}})
    assert exc.value.message == f"{field}: {message}"


def test_a_reading_both_read_and_dropped_refuses_the_heartbeat():
    with pytest.raises(HeartbeatError) as exc:
        validate_heartbeat({"node": "gpu01", "sensors": {"gpus": [{"index": 0, "power_watts": 300, "dropped": [SENTINEL]}]}})
    assert exc.value.message == (
        "sensors.gpus[0].dropped[0].reading: power_watts is read too (300); a reading dropped is absent"
    )


def test_no_more_dropped_entries_than_a_gpu_has_readings():
    with pytest.raises(HeartbeatError) as exc:
        validate_heartbeat({"node": "gpu01", "sensors": {"gpus": [{"index": 0, "dropped": [SENTINEL] * 8}]}})
    assert exc.value.message == "sensors.gpus[0].dropped: at most 7 entries"
