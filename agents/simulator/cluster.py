"""The simulator's cluster file: the nodes to simulate, read with llmgw.yamldoc, and the heartbeat each
node's inventory makes."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agents.node.protocol import SM_CLOCK_MHZ_MAX, is_node_name, node_name_problem
from facility.domains import DomainError, validate_label
from llmgw.errors import InvalidInput
from llmgw.yamldoc import is_number, is_whole_number, load_documents, read_text

NODE_KEYS = (
    "name",
    "gpus",
    "gpu_model",
    "gpu_memory_gib",
    "gpu_power_limit_watts",
    "gpu_max_sm_clock_mhz",
    "cpu_cores",
    "memory_gib",
    "fabric",
    "labels",
)
DEFAULT_INTERVAL_SECONDS = 10


def load_cluster(text: str, filename: str = "cluster.yaml") -> list[dict[str, Any]]:
    """The node specs of a cluster file, or InvalidInput naming the file, the line and the field."""
    docs = load_documents(text, filename)
    if len(docs) != 1:
        raise InvalidInput(f"{filename}: a cluster file is one YAML document with a nodes: list", field="nodes")
    doc = docs[0]
    data = doc.data
    if not isinstance(data, dict):
        raise doc.error((), "a cluster file is a mapping with a nodes: list")
    doc.check_keys((), data, ("nodes",), "a cluster file")
    nodes = data.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise doc.error(("nodes",), "must be a list of nodes, each with at least a name")
    specs: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, item in enumerate(nodes):
        path: tuple[str | int, ...] = ("nodes", i)
        if not isinstance(item, dict):
            raise doc.error(path, "must be a mapping with at least a name")
        doc.check_keys(path, item, NODE_KEYS, "a node")
        if "name" not in item:
            raise doc.error(path, "name is required")
        name = item["name"]
        if not is_node_name(name):
            raise doc.error((*path, "name"), node_name_problem(name))
        if name in seen:
            raise doc.error((*path, "name"), f"{name} is declared twice in this file")
        seen.add(name)
        spec: dict[str, Any] = {"name": name}
        for key, low, high in (("gpus", 0, 64), ("cpu_cores", 0, 16384)):
            value = item.get(key, 0)
            if not is_whole_number(value) or not low <= value <= high:
                raise doc.error((*path, key), f"must be a whole number from {low} to {high}, not {value!r}")
            spec[key] = value
        if "gpu_max_sm_clock_mhz" in item:  # the cards' top SM clock; a Hopper SXM card's when absent
            value = item["gpu_max_sm_clock_mhz"]
            if not is_whole_number(value) or not 1 <= value <= SM_CLOCK_MHZ_MAX:
                raise doc.error(
                    (*path, "gpu_max_sm_clock_mhz"), f"must be a whole number from 1 to {SM_CLOCK_MHZ_MAX} (MHz), not {value!r}"
                )
            spec["gpu_max_sm_clock_mhz"] = value
        for key, low, high in (
            ("gpu_memory_gib", 0, 4096),
            ("gpu_power_limit_watts", 1, 5000),
            ("memory_gib", 0, 1_048_576),
        ):
            if key not in item:
                continue
            value = item[key]
            if not is_number(value) or not low <= value <= high:
                raise doc.error((*path, key), f"must be a number from {low} to {high}, not {value!r}")
            spec[key] = float(value)
        for key in ("gpu_model", "fabric"):
            value = item.get(key)
            if value is not None and not isinstance(value, str):
                raise doc.error((*path, key), f"must be text, not {value!r}")
            if value:
                spec[key] = value
        labels = item.get("labels") or {}
        if not isinstance(labels, dict):
            raise doc.error((*path, "labels"), "must be a mapping of key: value")
        spec["labels"] = {}
        for key, value in labels.items():
            # An unquoted `row: 1` is a number in YAML; a label value is its text.
            if isinstance(value, int | float) and not isinstance(value, bool):
                value = str(value)
            try:
                if not isinstance(key, str):
                    raise DomainError(f"a label key is text, not {key!r}")
                validate_label(key, value)
            except DomainError as exc:
                raise doc.error((*path, "labels", str(key)), str(exc)) from exc
            spec["labels"][key] = value
        specs.append(spec)
    return specs


def load_cluster_file(path: str | Path) -> list[dict[str, Any]]:
    """load_cluster on a file; a missing file is an InvalidInput too."""
    path = Path(path)
    try:
        text = read_text(path)
    except InvalidInput as exc:
        raise InvalidInput(exc.message, field="file") from exc
    return load_cluster(text, path.name)


def heartbeat_for(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The heartbeat a node of the cluster file would send, with no load on it."""
    gpus = [
        {
            "index": i,
            "uuid": gpu_uuid(spec["name"], i),
            "name": spec.get("gpu_model", ""),
            "memory_gib": spec.get("gpu_memory_gib"),
            "power_limit_watts": spec.get("gpu_power_limit_watts"),
        }
        for i in range(spec.get("gpus", 0))
    ]
    return {
        "node": spec["name"],
        "agent_version": "sim",
        "interval_seconds": DEFAULT_INTERVAL_SECONDS,
        "inventory": {
            "gpus": gpus,
            "cpu_cores": spec.get("cpu_cores", 0),
            "memory_gib": spec.get("memory_gib", 0),
            "hostname": spec["name"],
            "fabric": spec.get("fabric") or "",
        },
        "labels": dict(spec.get("labels") or {}),
        "sensors": {},
        "replicas": [],
    }


def gpu_uuid(node_name: str, index: int) -> str:
    return f"GPU-sim-{node_name}-{index}"
