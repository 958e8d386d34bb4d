"""CPU package power from RAPL energy counters, on copies of fixture trees with a fake clock."""

from __future__ import annotations

from pathlib import Path

from agents.node.sensors import SensorReader, read_file_once
from tests.fakes.fake_nvml import library_missing
from tests.fakes.fixture_trees import FakeClock, copy_tree, tree

POWERCAP = "sys/class/powercap"


def reader(root: Path | str, clock: FakeClock, **kwargs) -> SensorReader:
    return SensorReader(sys_root=str(root), nvml=library_missing(), clock=clock, **kwargs)


def add_energy(root: Path, zone: str, microjoules: int) -> None:
    counter = root / POWERCAP / zone / "energy_uj"
    counter.write_text(f"{int(counter.read_text()) + microjoules}\n")


def set_energy(root: Path, zone: str, microjoules: int) -> None:
    (root / POWERCAP / zone / "energy_uj").write_text(f"{microjoules}\n")


def test_first_read_primes_and_the_second_gives_the_packages_sum(tmp_path):
    root = copy_tree("xeon", tmp_path)
    clock = FakeClock()
    node = reader(root, clock)
    assert "cpu_power_watts" not in node.read()

    clock.advance(10.0)
    add_energy(root, "intel-rapl:0", 2_200_000_000)  # 220 W over 10 s
    add_energy(root, "intel-rapl:1", 1_830_000_000)  # 183 W
    # Subzones, psys and the MMIO copy of package-0 move too; none of them may be added.
    for zone in ("intel-rapl:0:0", "intel-rapl:0:1", "intel-rapl:0:2", "intel-rapl:1:0", "intel-rapl:1:2"):
        add_energy(root, zone, 900_000_000)
    add_energy(root, "intel-rapl:2", 9_000_000_000)
    add_energy(root, "intel-rapl-mmio:0", 2_200_000_000)
    assert node.read()["cpu_power_watts"] == 403.0


def test_a_counter_wrap_between_two_reads_is_undone_with_max_energy_range(tmp_path):
    root = copy_tree("xeon", tmp_path)
    clock = FakeClock()
    set_energy(root, "intel-rapl:0", 262_000_000_000)  # 143.3 J short of its 262143328850 µJ range
    node = reader(root, clock)
    node.read()

    clock.advance(10.0)
    set_energy(root, "intel-rapl:0", 1_856_671_150)  # wrapped: 2000 J went by
    add_energy(root, "intel-rapl:1", 1_500_000_000)
    assert node.read()["cpu_power_watts"] == 350.0


def test_a_wrap_with_an_unknown_range_drops_that_sample_only(tmp_path):
    root = copy_tree("xeon", tmp_path)
    clock = FakeClock()
    (root / POWERCAP / "intel-rapl:0/max_energy_range_uj").unlink()
    node = reader(root, clock)
    node.read()

    clock.advance(10.0)
    set_energy(root, "intel-rapl:0", 1_000_000)
    assert "cpu_power_watts" not in node.read()

    clock.advance(10.0)
    add_energy(root, "intel-rapl:0", 2_000_000_000)
    add_energy(root, "intel-rapl:1", 1_000_000_000)
    assert node.read()["cpu_power_watts"] == 300.0


def test_a_counter_without_read_permission_is_absent_not_zero(tmp_path):
    root = copy_tree("xeon", tmp_path)
    clock = FakeClock()

    def read_file(path: str) -> str:
        if path.endswith("/intel-rapl:1/energy_uj"):
            # Root-only since the 2020 RAPL side-channel fix; CI runs as root, so inject it.
            raise PermissionError(13, "Permission denied", path)
        return read_file_once(path)

    node = reader(root, clock, read_file=read_file)
    node.read()
    clock.advance(10.0)
    add_energy(root, "intel-rapl:0", 2_000_000_000)
    add_energy(root, "intel-rapl:1", 2_000_000_000)
    reading = node.read()
    assert "cpu_power_watts" not in reading  # nor package-0's 200 W alone: a partial sum misleads
    assert reading["cpu_temperature_celsius"] == 63.0  # the rest of the node still reads


def test_mmio_zone_counts_only_when_the_msr_zone_is_missing(tmp_path):
    root = copy_tree("xeon", tmp_path)
    for zone in ("intel-rapl:0", "intel-rapl:0:0", "intel-rapl:0:1", "intel-rapl:0:2"):
        for child in (root / POWERCAP / zone).iterdir():
            child.unlink()
        (root / POWERCAP / zone).rmdir()
    clock = FakeClock()
    node = reader(root, clock)
    node.read()
    clock.advance(2.0)
    add_energy(root, "intel-rapl-mmio:0", 400_000_000)  # 200 W
    add_energy(root, "intel-rapl:1", 300_000_000)  # 150 W
    assert node.read()["cpu_power_watts"] == 350.0


def test_epyc_package_zone_gives_power(tmp_path):
    root = copy_tree("epyc", tmp_path)
    clock = FakeClock()
    node = reader(root, clock)
    node.read()
    clock.advance(5.0)
    add_energy(root, "intel-rapl:0", 600_000_000)
    assert node.read()["cpu_power_watts"] == 120.0


def test_a_vm_without_powercap_never_reports_cpu_power():
    clock = FakeClock()
    node = reader(tree("vm"), clock)
    node.read()
    clock.advance(10.0)
    assert "cpu_power_watts" not in node.read()
