"""What a replica keeps of why it went where it is, or why it waits: the explain documents."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from placement.planner import NoFit, Plan, reasons_grouped

# What a replica keeps of the rejections at the moment it was placed (or found no node).
KEPT_REJECTIONS = 20


def passed_over_summary(rejections: Mapping[str, str]) -> str:
    """``passed over (3 nodes): 2 × gpu: 8 requested, 0 free; 1 × …`` (at most five groups), or ``""``."""
    if not rejections:
        return ""
    total = len(rejections)
    return f"passed over ({total} node{'' if total == 1 else 's'}): {reasons_grouped(rejections)}"


def placed_explain(plan: Plan, *, attempts: int, conflicts: list[str]) -> dict[str, Any]:
    """What a placed replica keeps: its shards, why there, and the rejections of the nodes ranked ahead."""
    kept = list(plan.rejections.items())[:KEPT_REJECTIONS]
    return {
        "why": plan.why,
        "shards": [
            {
                "node": s.node,
                "gpus": list(s.gpu_indices),
                "cpu_cores": s.cpu_cores,
                "memory_gib": s.memory_gib,
                "draw_watts": s.draw_watts,
            }
            for s in plan.shards
        ],
        "passed_over": len(plan.rejections),
        "summary": passed_over_summary(plan.rejections),
        "rejections": [{"node": n, "reason": r} for n, r in kept],
        "attempts": attempts,
        "conflicts": conflicts,
    }


def pending_explain(nofit: NoFit) -> dict[str, Any]:
    """What a pending replica keeps: the summary and the first node reasons."""
    return {
        "summary": nofit.summary,
        "nodes_checked": len(nofit.rejections),
        "rejections": [{"node": n, "reason": r} for n, r in list(nofit.rejections.items())[:KEPT_REJECTIONS]],
    }
