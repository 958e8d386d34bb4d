"""CPU and inlet temperatures from hwmon, on fixture trees of real machines."""

from __future__ import annotations

from agents.node.sensors import SensorReader, read_file_once
from agents.node.sensors.hwmon import read_channels
from tests.fakes.fake_nvml import library_missing
from tests.fakes.fixture_trees import copy_tree, tree


def sensors(root: str, **kwargs) -> dict:
    return SensorReader(sys_root=root, nvml=library_missing(), **kwargs).read()


def test_xeon_reports_the_hottest_package_and_the_systin_inlet():
    # Packages are 58 and 63 °C; a core at 64, acpitz at 97.8 and an NVMe at 71.85 must not win.
    reading = sensors(tree("xeon"))
    assert reading["cpu_temperature_celsius"] == 63.0
    assert reading["inlet_temperature_celsius"] == 24.0


def test_epyc_prefers_tdie_over_tctl_and_has_no_inlet():
    reading = sensors(tree("epyc"))
    assert reading["cpu_temperature_celsius"] == 45.0  # Tdie; Tctl (72, with its offset) is not used
    assert "inlet_temperature_celsius" not in reading


def test_vm_reports_no_temperature_keys_at_all():
    assert sensors(tree("vm")) == {"gpus": []}


def test_k10temp_without_tdie_falls_back_to_tctl(tmp_path):
    root = copy_tree("epyc", tmp_path)
    for suffix in ("input", "label"):
        (root / f"sys/class/hwmon/hwmon0/temp2_{suffix}").unlink()
    assert sensors(str(root))["cpu_temperature_celsius"] == 72.0


def test_coretemp_without_package_channels_reports_the_hottest_core(tmp_path):
    root = copy_tree("xeon", tmp_path)
    for hwmon in ("hwmon2", "hwmon3"):
        (root / f"sys/class/hwmon/{hwmon}/temp1_label").write_text("Core 99\n")
        (root / f"sys/class/hwmon/{hwmon}/temp1_input").write_text("20000\n")
    assert sensors(str(root))["cpu_temperature_celsius"] == 64.0


def read_text(path: str) -> str | None:
    try:
        return read_file_once(path)
    except OSError:
        return None


def test_a_disabled_channel_is_skipped(tmp_path):
    channels = read_channels(tree("xeon"), read_text)
    nct = [channel.label for channel in channels if channel.chip == "nct6775"]
    assert nct == ["SYSTIN", "CPUTIN"]  # AUXTIN0 has temp3_enable = 0 (and reads a floating 127 °C)

    root = copy_tree("xeon", tmp_path)
    (root / "sys/class/hwmon/hwmon3/temp1_enable").write_text("0\n")
    assert sensors(str(root))["cpu_temperature_celsius"] == 58.0


def test_values_outside_the_plausible_range_are_dropped(tmp_path):
    root = copy_tree("xeon", tmp_path)
    (root / "sys/class/hwmon/hwmon3/temp1_input").write_text("255000\n")
    (root / "sys/class/hwmon/hwmon4/device/temp1_input").write_text("-128000\n")
    reading = sensors(str(root))
    assert reading["cpu_temperature_celsius"] == 58.0
    assert "inlet_temperature_celsius" not in reading


def test_an_unreadable_channel_is_left_out_and_the_rest_still_read():
    def read_file(path: str) -> str:
        if path.endswith("hwmon3/temp1_input"):
            raise OSError(61, "No data available")  # ENODATA, as a disabled channel answers
        return read_file_once(path)

    reading = sensors(tree("xeon"), read_file=read_file)
    assert reading["cpu_temperature_celsius"] == 58.0
    assert reading["inlet_temperature_celsius"] == 24.0


def test_inlet_labels_match_case_insensitively(tmp_path):
    root = copy_tree("epyc", tmp_path)
    board = root / "sys/class/hwmon/hwmon2"
    board.mkdir()
    (board / "name").write_text("nct7904\n")
    (board / "temp1_label").write_text("Inlet Temp\n")
    (board / "temp1_input").write_text("22500\n")
    assert sensors(str(root))["inlet_temperature_celsius"] == 22.5
