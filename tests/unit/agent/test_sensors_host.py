"""The node's cores, memory and name for its inventory, read under the sensor root."""

from __future__ import annotations

from agents.node.sensors import SensorReader, read_file_once
from tests.fakes.fake_nvml import library_missing
from tests.fakes.fixture_trees import copy_tree, tree


def inventory(root: str, **kwargs) -> dict:
    return SensorReader(sys_root=root, nvml=library_missing(), **kwargs).inventory()


def test_fixture_machines_report_their_own_size_and_name():
    assert inventory(tree("xeon")) == {"gpus": [], "cpu_cores": 96, "memory_gib": 2015.6, "hostname": "gpu01"}
    assert inventory(tree("epyc")) == {
        "gpus": [],
        "cpu_cores": 128,
        "memory_gib": 1511.1,
        "hostname": "gpu02",
    }
    assert inventory(tree("vm")) == {"gpus": [], "cpu_cores": 8, "memory_gib": 31.3, "hostname": "vm01"}


def test_split_cpu_lists_are_counted(tmp_path):
    root = copy_tree("xeon", tmp_path)
    (root / "sys/devices/system/cpu/online").write_text("0-47,96-143\n")
    assert inventory(str(root))["cpu_cores"] == 96


def test_unknown_values_are_left_out_never_zero_and_never_the_hosts():
    def read_file(path: str) -> str:
        if path.endswith(("/online", "/meminfo", "/hostname")):
            raise PermissionError(13, "Permission denied", path)
        return read_file_once(path)

    assert inventory(tree("vm"), read_file=read_file) == {"gpus": []}
