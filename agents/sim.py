"""The simulator: agents for the nodes a cluster file declares (filled in by the agent work)."""

from __future__ import annotations

from typing import Any


def heartbeat_for(spec: dict[str, Any]) -> dict[str, Any]:
    """The heartbeat a node of the cluster file would send, with no load on it."""
    gpus = [
        {
            "index": i,
            "uuid": f"GPU-sim-{spec['name']}-{i}",
            "name": spec.get("gpu_model", ""),
            "memory_gib": spec.get("gpu_memory_gib"),
            "power_limit_watts": spec.get("gpu_power_limit_watts"),
        }
        for i in range(spec.get("gpus", 0))
    ]
    return {
        "node": spec["name"],
        "agent_version": "sim",
        "interval_seconds": 10,
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
