"""What a replica keeps of why it went where it is, or why it waits: the explain documents."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter

from placement.planner import NoFit, Plan, reasons_grouped

# What a replica keeps of the rejections at the moment it was placed (or found no node).
KEPT_REJECTIONS = 20

# Observe mode: what enforcement would have done to the placements made (in this process; on workers,
# each worker's own /metrics is not served, so the embedded default is where it counts).
WOULD_TOTAL = Counter(
    "llmgw_placement_would",
    "Placements that thermal enforcement would have refused or scored down (observe mode).",
    ["decision"],
)
_DECISIONS = {"would have refused": "refused", "would have scored down": "scored_down"}


def count_would(notes: tuple[str, ...]) -> None:
    """Count each observe-mode note of a placement under its decision."""
    for note in notes:
        decision = _DECISIONS.get(note.split(":", 1)[0])
        if decision:
            WOULD_TOTAL.labels(decision=decision).inc()


def passed_over_summary(rejections: Mapping[str, str]) -> str:
    """``passed over (3 nodes): 2 × gpu: 8 requested, 0 free; 1 × …`` (at most five groups), or ``""``."""
    if not rejections:
        return ""
    total = len(rejections)
    return f"passed over ({total} node{'' if total == 1 else 's'}): {reasons_grouped(rejections)}"


def placed_explain(plan: Plan, *, attempts: int, conflicts: list[str]) -> dict[str, Any]:
    """What a placed replica keeps: its shards, why there, and the rejections of the nodes ranked ahead."""
    kept = list(plan.rejections.items())[:KEPT_REJECTIONS]
    count_would(plan.notes)
    return {
        "why": plan.why,
        "notes": list(plan.notes),
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
