"""GPU capping through a fake pynvml: set, clamp, read back, restore, idempotence, refusals."""

from __future__ import annotations

import threading

import pynvml
import pytest

from agents.node.protocol import validate_capping
from agents.node.sensors import SensorReader
from tests.fakes.fake_nvml import FakeGpu, a100_sxm, fake_nvml, h100_sxm, l40s
from tests.fakes.fixture_trees import tree


def reader(*gpus: FakeGpu, **kwargs) -> SensorReader:
    return SensorReader(sys_root=tree("vm"), nvml=fake_nvml(list(gpus)), **kwargs)


def power(watts, uuid: str | None = None) -> dict:
    if uuid is None:
        return {"lever": "power_limit", "all": {"power_limit_watts": watts}}
    return {"lever": "power_limit", "gpus": [{"uuid": uuid, "power_limit_watts": watts}]}


def clocks(low: int, high: int) -> dict:
    return {"lever": "locked_clocks", "all": {"locked_clocks_mhz": [low, high]}}


def apply(node: SensorReader, block: dict | None) -> dict:
    """Apply the block, then the GPU readings the next heartbeat carries, by uuid."""
    assert node.apply_capping(validate_capping(block))
    return {g["uuid"]: g for g in node.read()["gpus"]}


def test_a_wanted_power_limit_is_set_in_milliwatts_and_the_enforced_limit_read_back():
    gpu = h100_sxm(0)
    reading = apply(reader(gpu), power(490))["GPU-h100-0000"]
    assert gpu.power_limit_mw == 490_000
    assert reading["enforced_power_limit_watts"] == 490.0
    assert reading["default_power_limit_watts"] == 700.0
    assert "capping" not in reading and "locked_clocks_mhz" not in reading


def test_the_enforced_limit_is_what_every_limiter_leaves_not_what_was_set():
    gpu = h100_sxm(0)
    gpu.other_limiter_mw = 450_000
    assert apply(reader(gpu), power(490))["GPU-h100-0000"]["enforced_power_limit_watts"] == 450.0


@pytest.mark.parametrize(("wanted", "held_mw"), [(100, 200_000), (900, 700_000), (333.3333, 333_333)])
def test_a_wanted_limit_is_held_within_the_cards_constraints(wanted, held_mw):
    gpu = h100_sxm(0)
    apply(reader(gpu), power(wanted))
    assert gpu.power_limit_mw == held_mw


def test_no_capping_block_restores_the_default_limit_and_unlocks_the_clocks():
    gpu = h100_sxm(0)
    node = reader(gpu)
    apply(node, clocks(900, 1400))
    apply(node, power(490))
    assert gpu.locked_clocks_mhz is None  # the other lever went back to its default
    reading = apply(node, None)["GPU-h100-0000"]
    assert gpu.power_limit_mw == 700_000
    assert reading["enforced_power_limit_watts"] == 700.0


def test_a_value_already_in_force_makes_no_set_call():
    gpu = h100_sxm(0)
    node = reader(gpu)
    apply(node, power(490))
    apply(node, power(490))
    apply(node, None)
    apply(node, None)
    # The first pass also unlocks the clocks once: a fresh agent cannot read whether they were locked.
    assert gpu.set_calls == [("power_limit_mw", 490_000), ("locked_clocks_mhz", None), ("power_limit_mw", 700_000)]


def test_a_gpu_listed_by_uuid_overrides_all_and_an_unknown_uuid_is_ignored():
    first, second, third = h100_sxm(0), h100_sxm(1), h100_sxm(2)
    block = {
        "lever": "power_limit",
        "all": {"power_limit_watts": 500},
        "gpus": [{"uuid": "GPU-h100-0001", "power_limit_watts": 400}, {"uuid": "GPU-elsewhere", "power_limit_watts": 300}],
    }
    apply(reader(first, second, third), block)
    assert [g.power_limit_mw for g in (first, second, third)] == [500_000, 400_000, 500_000]


def test_a_gpu_not_named_without_all_keeps_its_default():
    first, second = h100_sxm(0), h100_sxm(1)
    second.power_limit_mw = 600_000  # left capped by an earlier agent
    apply(reader(first, second), power(450, uuid="GPU-h100-0000"))
    assert (first.power_limit_mw, second.power_limit_mw) == (450_000, 700_000)


def test_locked_clocks_are_set_held_below_the_top_clock_reported_and_reset():
    gpu = h100_sxm(0)
    node = reader(gpu)
    reading = apply(node, clocks(1200, 2500))["GPU-h100-0000"]
    assert gpu.locked_clocks_mhz == (1200, 1980)
    assert reading["locked_clocks_mhz"] == [1200, 1980]
    reading = apply(node, None)["GPU-h100-0000"]
    assert gpu.locked_clocks_mhz is None
    assert "locked_clocks_mhz" not in reading


def test_each_card_holds_a_lock_below_its_own_top_clock_read_once():
    a100, l40 = a100_sxm(0), l40s(1)
    node = reader(a100, l40)
    readings = apply(node, clocks(210, 2016))
    assert (a100.locked_clocks_mhz, l40.locked_clocks_mhz) == ((210, 1410), (210, 2016))
    assert readings["GPU-a100-0000"]["max_sm_clock_mhz"] == 1410
    assert readings["GPU-l40s-0001"]["locked_clocks_mhz"] == [210, 2016]
    apply(node, clocks(210, 1128))
    assert a100.locked_clocks_mhz == (210, 1128)
    assert a100.calls["nvmlDeviceGetMaxClockInfo"] == l40.calls["nvmlDeviceGetMaxClockInfo"] == 1


def test_without_root_the_gpu_reports_not_permitted_and_its_readings_still_go_out():
    gpu = h100_sxm(0)
    gpu.privileged = False
    node = reader(gpu)
    reading = apply(node, power(490))["GPU-h100-0000"]
    assert reading["capping"] == "not permitted"
    assert reading["power_watts"] == 312.5 and reading["enforced_power_limit_watts"] == 700.0
    assert gpu.power_limit_mw == 700_000


def test_without_root_and_nothing_asked_nothing_is_reported():
    gpu = h100_sxm(0)
    gpu.privileged = False
    node = reader(gpu)
    assert "capping" not in apply(node, None)["GPU-h100-0000"]
    assert "capping" not in apply(node, None)["GPU-h100-0000"]


def test_locking_clocks_without_root_reports_not_permitted_until_the_block_goes():
    gpu = h100_sxm(0)
    gpu.privileged = False
    node = reader(gpu)
    assert apply(node, clocks(900, 1400))["GPU-h100-0000"]["capping"] == "not permitted"
    assert "capping" not in apply(node, None)["GPU-h100-0000"]


def test_a_card_without_the_control_reports_not_supported():
    gpu = h100_sxm(0)
    gpu.errors["nvmlDeviceSetPowerManagementLimit"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    gpu.errors["nvmlDeviceGetPowerManagementDefaultLimit"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    node = reader(gpu)
    reading = apply(node, power(490))["GPU-h100-0000"]
    assert reading["capping"] == "not supported"
    assert "default_power_limit_watts" not in reading
    # Restoring cannot read the default either: said the same way, never raised.
    assert apply(node, None)["GPU-h100-0000"]["capping"] == "not supported"


def test_an_older_driver_without_clock_locking_reports_not_supported():
    gpu = h100_sxm(0)
    gpu.errors["nvmlDeviceSetGpuLockedClocks"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    assert apply(reader(gpu), clocks(900, 1400))["GPU-h100-0000"]["capping"] == "not supported"


def test_another_refusal_is_logged_and_tried_again_with_the_next_answer(caplog):
    gpu = h100_sxm(0)
    gpu.errors["nvmlDeviceSetPowerManagementLimit"] = pynvml.NVML_ERROR_INVALID_ARGUMENT
    node = reader(gpu)
    assert "capping" not in apply(node, power(490))["GPU-h100-0000"]
    assert "power limit not changed" in caplog.text
    del gpu.errors["nvmlDeviceSetPowerManagementLimit"]
    apply(node, power(490))
    assert gpu.power_limit_mw == 490_000


def test_a_lost_gpu_is_left_out_and_the_others_are_capped():
    lost, fine = h100_sxm(0), h100_sxm(1)
    lost.lost = True
    node = reader(lost, fine)
    assert node.apply_capping(validate_capping(power(490)))
    assert fine.power_limit_mw == 490_000


def test_a_hung_gpu_does_not_hold_the_heartbeat_past_the_deadline():
    gpu = h100_sxm(0)
    gpu.hang = threading.Event()
    node = reader(gpu, nvml_deadline_seconds=0.2)
    try:
        assert node.apply_capping(validate_capping(power(490))) is False
    finally:
        gpu.hang.set()
        for thread in threading.enumerate():
            if thread.name == "llmgw-nvml":
                thread.join(10)
    assert node.apply_capping(validate_capping(power(490)))
    assert gpu.power_limit_mw == 490_000


def test_without_nvml_capping_is_a_no_op():
    node = SensorReader(sys_root=tree("vm"), nvml=fake_nvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    assert node.apply_capping(validate_capping(power(490)))
    assert node.read()["gpus"] == []
