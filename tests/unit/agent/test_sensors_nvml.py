"""GPU inventory and readings through a fake pynvml that scripts each device's answers."""

from __future__ import annotations

import threading

import pynvml

from agents.node.protocol import GPU_INVENTORY_KEYS, GPU_SENSOR_KEYS
from agents.node.sensors import SensorReader
from agents.node.sensors.nvml import NvmlSession, dropped_text
from tests.fakes.fake_nvml import a100_sxm, fake_nvml, h100_sxm, l4, l40s, library_missing
from tests.fakes.fixture_trees import tree

H100_READING = {
    "uuid": "GPU-h100-0000",
    "index": 0,
    "temperature_celsius": 54.0,
    "memory_temperature_celsius": 61.0,
    "slowdown_temperature_celsius": 89.0,
    "power_watts": 312.5,
    "power_limit_watts": 700.0,
    "throttle_reasons": ["sw_power_cap"],
    "enforced_power_limit_watts": 700.0,
    "default_power_limit_watts": 700.0,
    "max_sm_clock_mhz": 1980,
}


def reader(nvml, root: str = tree("vm"), **kwargs) -> SensorReader:
    return SensorReader(sys_root=root, nvml=nvml, **kwargs)


def release_nvml_worker() -> None:
    """Wait for a worker left blocked by a hung call, once the test has released the hang."""
    for thread in threading.enumerate():
        if thread.name == "llmgw-nvml":
            thread.join(10)


def test_h100_with_every_sensor_supported():
    reading = reader(fake_nvml([h100_sxm(0)])).read()
    assert reading["gpus"] == [H100_READING]


def test_inventory_lists_each_gpu_with_memory_and_power_limit():
    inventory = reader(fake_nvml([h100_sxm(0), h100_sxm(1)]), root=tree("xeon")).inventory()
    assert inventory == {
        "gpus": [
            {
                "index": 0,
                "uuid": "GPU-h100-0000",
                "name": "NVIDIA H100 80GB HBM3",
                "memory_gib": 79.6,
                "power_limit_watts": 700.0,
                "power_limit_min_watts": 200.0,
                "power_limit_max_watts": 700.0,  # the top of its limit's range: the most it can draw
            },
            {
                "index": 1,
                "uuid": "GPU-h100-0001",
                "name": "NVIDIA H100 80GB HBM3",
                "memory_gib": 79.6,
                "power_limit_watts": 700.0,
                "power_limit_min_watts": 200.0,
                "power_limit_max_watts": 700.0,  # the top of its limit's range: the most it can draw
            },
        ],
        # Nothing of their wiring is scripted here: unknown, never a guess (test_sensors_topology reads some).
        "gpu_topology": {"links": [["X", None], [None, "X"]], "numa": [None, None]},
        "cpu_cores": 96,
        "memory_gib": 2015.6,
        "hostname": "gpu01",
    }


def test_slowdown_temperature_not_supported_is_absent_not_zero():
    gpu = h100_sxm(0)
    gpu.slowdown_temperature = None
    (reading,) = reader(fake_nvml([gpu])).read()["gpus"]
    assert "slowdown_temperature_celsius" not in reading
    assert reading["temperature_celsius"] == 54.0


def test_memory_temperature_not_supported_is_absent_not_zero():
    (gpu,) = reader(fake_nvml([l4(0)])).read()["gpus"]
    assert "memory_temperature_celsius" not in gpu
    assert gpu == {
        "uuid": "GPU-l4-0000",
        "index": 0,
        "temperature_celsius": 47.0,
        "slowdown_temperature_celsius": 87.0,
        "power_watts": 41.25,
        "power_limit_watts": 72.0,
        "throttle_reasons": [],  # only GpuIdle is set, which is not a limiter
        "enforced_power_limit_watts": 72.0,
        "default_power_limit_watts": 72.0,
        "max_sm_clock_mhz": 2040,
    }


def test_each_card_reports_its_own_top_sm_clock():
    gpus = reader(fake_nvml([h100_sxm(0), a100_sxm(1), l40s(2), l4(3)])).read()["gpus"]
    assert {g["uuid"]: g["max_sm_clock_mhz"] for g in gpus} == {
        "GPU-h100-0000": 1980,
        "GPU-a100-0001": 1410,
        "GPU-l40s-0002": 2520,
        "GPU-l4-0003": 2040,
    }
    assert {g["uuid"]: g["default_power_limit_watts"] for g in gpus}["GPU-a100-0001"] == 400.0


def test_the_top_sm_clock_is_read_once_per_gpu():
    gpu = a100_sxm(0)
    node = reader(fake_nvml([gpu]))
    for _ in range(3):
        (reading,) = node.read()["gpus"]
        assert reading["max_sm_clock_mhz"] == 1410
    assert gpu.calls["nvmlDeviceGetMaxClockInfo"] == 1


def test_a_top_sm_clock_nvml_cannot_tell_is_absent_not_zero_and_not_asked_again():
    gpu = h100_sxm(0)
    gpu.max_sm_clock_mhz = None  # Not Supported
    node = reader(fake_nvml([gpu]))
    for _ in range(2):
        (reading,) = node.read()["gpus"]
        assert reading == {key: value for key, value in H100_READING.items() if key != "max_sm_clock_mhz"}
    assert gpu.calls["nvmlDeviceGetMaxClockInfo"] == 1


def test_a_top_sm_clock_that_failed_otherwise_is_asked_again_and_then_reported():
    gpu = l40s(0)
    gpu.errors["nvmlDeviceGetMaxClockInfo"] = pynvml.NVML_ERROR_UNKNOWN
    node = reader(fake_nvml([gpu]))
    (reading,) = node.read()["gpus"]
    assert "max_sm_clock_mhz" not in reading
    del gpu.errors["nvmlDeviceGetMaxClockInfo"]
    (reading,) = node.read()["gpus"]
    assert reading["max_sm_clock_mhz"] == 2520


def test_a_top_sm_clock_outside_the_protocols_bounds_is_left_out_so_the_heartbeat_still_goes():
    gpu = h100_sxm(0)
    gpu.max_sm_clock_mhz = 1_980_000  # a kHz figure
    (reading,) = reader(fake_nvml([gpu])).read()["gpus"]
    assert "max_sm_clock_mhz" not in reading


def test_several_clock_limiters_at_once_are_all_named_and_other_bits_ignored():
    gpu = h100_sxm(0)
    gpu.clock_event_reasons = 0x001 | 0x002 | 0x004 | 0x008 | 0x010 | 0x020 | 0x040 | 0x080 | 0x100
    (reading,) = reader(fake_nvml([gpu])).read()["gpus"]
    assert reading["throttle_reasons"] == [
        "sw_power_cap",
        "hw_slowdown",
        "sw_thermal",
        "hw_thermal",
        "power_brake",
    ]


def test_one_failing_field_is_left_out_and_the_others_are_kept():
    gpu = h100_sxm(0)
    gpu.errors = {"nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_NOT_SUPPORTED}
    (reading,) = reader(fake_nvml([gpu])).read()["gpus"]
    assert reading == {key: value for key, value in H100_READING.items() if key != "power_watts"}


def test_an_older_driver_without_the_new_calls_uses_the_deprecated_ones():
    gpu = h100_sxm(0)
    gpu.errors = {
        "nvmlDeviceGetTemperatureV": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        "nvmlDeviceGetCurrentClocksEventReasons": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    }
    assert reader(fake_nvml([gpu])).read()["gpus"] == [H100_READING]


def test_a_lost_gpu_is_left_out_the_others_reported_then_nvml_is_reinitialised():
    gpus = [h100_sxm(0), h100_sxm(1), h100_sxm(2)]
    gpus[1].lost = True
    nvml = fake_nvml(gpus)
    node = reader(nvml)
    assert [gpu["uuid"] for gpu in node.read()["gpus"]] == ["GPU-h100-0000", "GPU-h100-0002"]
    assert (nvml.init_calls, nvml.shutdown_calls) == (1, 0)

    gpus[1].lost = False  # back after a reset
    assert [gpu["uuid"] for gpu in node.read()["gpus"]] == ["GPU-h100-0000", "GPU-h100-0001", "GPU-h100-0002"]
    assert (nvml.init_calls, nvml.shutdown_calls) == (2, 1)

    node.read()
    assert nvml.init_calls == 2  # a healthy session is kept, not opened every read


def test_an_uninitialised_library_is_opened_again_on_the_next_read():
    nvml = fake_nvml([h100_sxm(0)])
    node = reader(nvml)
    node.read()
    nvml.initialised = False  # the driver was reloaded under us
    assert node.read()["gpus"] == []
    assert node.read()["gpus"] == [H100_READING]
    assert nvml.init_calls == 2


def test_library_missing_reports_no_gpus_and_the_reader_goes_on():
    node = reader(library_missing(), root=tree("xeon"))
    reading = node.read()
    assert reading["gpus"] == []
    assert reading["cpu_temperature_celsius"] == 63.0
    assert node.inventory()["gpus"] == []  # no driver: a node without GPUs


def test_a_hung_call_returns_without_gpu_values_within_the_deadline():
    gpu = h100_sxm(0)
    gpu.hang = threading.Event()
    node = reader(fake_nvml([gpu]), root=tree("xeon"), nvml_deadline_seconds=0.2)
    try:
        reading = node.read()
        assert reading["gpus"] == []
        assert reading["cpu_temperature_celsius"] == 63.0
        # Still stuck: no second worker is started on top of the first, and the inventory
        # does not claim the node has no GPUs.
        inventory = node.inventory()
        assert "gpus" not in inventory
        assert inventory["cpu_cores"] == 96
        assert sum(thread.name == "llmgw-nvml" for thread in threading.enumerate()) == 1
    finally:
        gpu.hang.set()
        release_nvml_worker()
    assert node.read()["gpus"] == [H100_READING]


def test_close_ends_the_nvml_session():
    nvml = fake_nvml([h100_sxm(0)])
    node = reader(nvml)
    node.read()
    node.close()
    assert (nvml.init_calls, nvml.shutdown_calls) == (1, 1)


def test_the_real_binding_on_this_machine_does_not_raise():
    # Whatever this machine is (no GPU, a VM, a GPU node), read() gives only known keys, never null.
    node = SensorReader()
    try:
        reading = node.read()
        inventory = node.inventory()
    finally:
        node.close()
    assert set(reading) <= {"gpus", "cpu_temperature_celsius", "cpu_power_watts", "inlet_temperature_celsius"}
    assert isinstance(reading["gpus"], list)
    assert None not in reading.values()
    assert inventory["cpu_cores"] >= 1


def test_power_read_as_nvmls_not_available_value_is_dropped_and_named():
    # 0xFFFFFFFF mW: what nvmlDeviceGetPowerUsage gives for a value the card cannot tell (4,294,967 W).
    gpu = h100_sxm(0)
    gpu.power_mw = 0xFFFFFFFF
    reading = NvmlSession(fake_nvml([gpu])).readings()[0]
    assert "power_watts" not in reading
    assert reading["dropped"] == [
        {"reading": "power_watts", "value": 4294967.295, "why": "0xFFFFFFFF mW, NVML's not-available value"}
    ]
    assert reading["temperature_celsius"] == 54.0  # the card's other readings are kept


def test_every_power_and_temperature_field_nvml_cannot_give_is_dropped_and_named():
    gpu = h100_sxm(0)
    gpu.power_limit_mw = 0xFFFFFFFF  # the enforced limit, read back as the card's limit
    gpu.default_power_limit_mw = 6_000_000
    gpu.temperature = 0xFFFFFFFF
    gpu.memory_temperature = 200
    reading = NvmlSession(fake_nvml([gpu])).readings()[0]
    for key in ("power_limit_watts", "enforced_power_limit_watts", "default_power_limit_watts"):
        assert key not in reading
    assert "temperature_celsius" not in reading and "memory_temperature_celsius" not in reading
    assert [dropped_text(entry) for entry in reading["dropped"]] == [
        "temperature_celsius: 0xFFFFFFFF, NVML's not-available value; dropped",
        "memory_temperature_celsius: 200 °C is outside -40…150 °C; dropped",
        "power_limit_watts: 0xFFFFFFFF mW, NVML's not-available value; dropped",
        "enforced_power_limit_watts: 0xFFFFFFFF mW, NVML's not-available value; dropped",
        "default_power_limit_watts: 6000 W is more than any card draws (5000 W); dropped",
    ]
    assert reading["power_watts"] == 312.5


def test_a_reading_nvml_gives_whole_says_nothing_dropped():
    assert "dropped" not in NvmlSession(fake_nvml([h100_sxm(0)])).readings()[0]


def test_inventory_sends_each_cards_power_limit_range():
    inventory = NvmlSession(fake_nvml([l4(0), a100_sxm(1)])).inventory()
    ranges = [(g["power_limit_min_watts"], g["power_limit_max_watts"]) for g in inventory]
    assert ranges == [(40.0, 72.0), (100.0, 400.0)]


def test_a_power_limit_range_nvml_cannot_give_is_left_out_and_named():
    gpu = l40s(0)
    gpu.power_limit_constraints_mw = (100_000, 0xFFFFFFFF)
    card = NvmlSession(fake_nvml([gpu])).inventory()[0]
    assert "power_limit_min_watts" not in card and "power_limit_max_watts" not in card
    assert [dropped_text(entry) for entry in card["dropped"]] == [
        "power_limit_max_watts: 0xFFFFFFFF mW, NVML's not-available value; dropped"
    ]
    gpu.power_limit_constraints_mw = (300_000, 100_000)
    card = NvmlSession(fake_nvml([gpu])).inventory()[0]
    assert [dropped_text(entry) for entry in card["dropped"]] == [
        "power_limit_min_watts: 300 W above the maximum's 100 W is no range; dropped"
    ]


def test_the_heartbeat_carries_only_what_the_protocol_takes_and_the_drop_is_logged_once(caplog):
    # The sentinel never reaches the heartbeat as a reading: the GPU's `dropped` names it (the control plane
    # flags the node for it), and the agent's log says what went, once.
    gpu = h100_sxm(0)
    gpu.power_mw = 0xFFFFFFFF
    sensors = reader(fake_nvml([gpu]))
    for _ in range(3):
        reading = sensors.read()["gpus"][0]
        card = sensors.inventory()["gpus"][0]
    assert "power_watts" not in reading
    assert [entry["reading"] for entry in reading["dropped"]] == ["power_watts"]
    assert set(reading) <= GPU_SENSOR_KEYS | {"enforced_power_limit_watts", "default_power_limit_watts", "max_sm_clock_mhz"}
    assert set(card) <= GPU_INVENTORY_KEYS
    said = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert said == ["GPU 0 reading: power_watts: 0xFFFFFFFF mW, NVML's not-available value; dropped"]
