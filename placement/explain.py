"""What a replica keeps of why it went where it is, or why it waits: the explain documents; and the rules
placement applies (every registered filter and scorer, its words and what it reads), from the registry."""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from itertools import islice
from typing import Any

from django.conf import settings

from placement.causes import nofit_causes
from placement.planner import NoFit, Plan, reasons_grouped
from placement.plugins import REGISTRY as PLUGINS

log = logging.getLogger(__name__)

# What a replica keeps of the rejections at the moment it was placed (or found no node).
KEPT_REJECTIONS = 20

# Observe mode: what enforcement would have done to the placements made. Placements happen in web
# processes and on workers; with Redis the counts are kept there (one hash), so the /metrics any web
# process serves counts them all. The embedded default keeps them in its one process.
WOULD_KEY = "llmgw:placement_would_total"
_DECISIONS = {"would have refused": "refused", "would have scored down": "scored_down"}
_local_counts: dict[str, int] = {}
_redis = None


def _redis_client():
    global _redis
    if _redis is None:
        import redis

        _redis = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=0.5, socket_connect_timeout=0.5)
    return _redis


def count_would(notes: tuple[str, ...]) -> None:
    """Count each observe-mode note of a placement under its decision (never fails the placement)."""
    for note in notes:
        decision = _DECISIONS.get(note.split(":", 1)[0])
        if not decision:
            continue
        if settings.REDIS_URL:
            try:
                _redis_client().hincrby(WOULD_KEY, decision, 1)
            except Exception:  # a metric is never worth a placement
                log.warning("observe-mode count not kept in Redis", exc_info=True)
        else:
            _local_counts[decision] = _local_counts.get(decision, 0) + 1


def would_counts() -> dict[str, int]:
    """Every decision's count so far (all processes with Redis), for /metrics."""
    counts = dict.fromkeys(_DECISIONS.values(), 0)
    if settings.REDIS_URL:
        try:
            stored = _redis_client().hgetall(WOULD_KEY)
        except Exception:
            log.warning("observe-mode counts not read from Redis", exc_info=True)
            return counts
        counts.update({k.decode(): int(v) for k, v in stored.items() if k.decode() in counts})
    else:
        counts.update(_local_counts)
    return counts


# The loaded plugins' failures and switch-offs, counted in each process by placement.plugins.REGISTRY:
# with Redis each process adds what it counted since it last did to one hash, once a placement is done
# (a plugin failing on every node is one write, not one a node); /metrics reads the hash.
PLUGIN_COUNTS_KEY = "llmgw:plugin_counts"


def _plugin_counts_now() -> Counter:
    counts: Counter = Counter()
    for (plugin, kind, error), n in PLUGINS.failure_counts.items():
        counts[f"failed\t{plugin}\t{kind}\t{error}"] = n
    for plugin, n in PLUGINS.switch_offs.items():
        counts[f"switched_off\t{plugin}"] = n
    return counts


def plugin_counts_send() -> None:
    """Add what this process counted of its plugins since it last sent to Redis (never fails a placement)."""
    if not settings.REDIS_URL or not (PLUGINS.failure_counts or PLUGINS.switch_offs):
        return
    sent = PLUGINS.sent
    delta = {key: n - sent.get(key, 0) for key, n in _plugin_counts_now().items() if n > sent.get(key, 0)}
    if not delta:
        return
    try:
        pipe = _redis_client().pipeline(transaction=False)
        for key, n in delta.items():
            pipe.hincrby(PLUGIN_COUNTS_KEY, key, n)
        pipe.execute()
    except Exception:  # a metric is never worth a placement
        log.warning("plugin failure counts not kept in Redis", exc_info=True)
        return
    sent.update(delta)


def plugin_counts_sent(fn: Callable) -> Callable:
    """Send the plugins' counts once ``fn`` (a placement) is done, however it ended."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            plugin_counts_send()

    return wrapper


def plugin_counts() -> tuple[dict[tuple[str, str, str], int], dict[str, int]]:
    """Every plugin's failures by (plugin, kind, error), and its switch-offs, so far (all processes with
    Redis), for /metrics."""
    if not settings.REDIS_URL:
        return dict(PLUGINS.failure_counts), dict(PLUGINS.switch_offs)
    plugin_counts_send()
    try:
        stored = _redis_client().hgetall(PLUGIN_COUNTS_KEY)
    except Exception:
        log.warning("plugin failure counts not read from Redis", exc_info=True)
        return {}, {}
    failed: dict[tuple[str, str, str], int] = {}
    switched: dict[str, int] = {}
    for key, value in stored.items():
        parts = key.decode().split("\t")
        if parts[0] == "failed" and len(parts) == 4:
            failed[(parts[1], parts[2], parts[3])] = int(value)
        elif parts[0] == "switched_off" and len(parts) == 2:
            switched[parts[1]] = int(value)
    return failed, switched


def rules_listing() -> dict[str, Any]:
    """Every registered filter (in the order they are asked, power last) and scorer (in the order their keys
    rank, the node's name last), each with its words, the node's fields it reads, whether the commit asks it
    again, and whether it is built in; and whether the index keeps its plans with them (``index``: ``kept``,
    or why every plan goes the plain way). The loaded plugins and their load errors, of this process."""
    rules = [
        {
            "kind": "filter", "id": item.id, "order": None, "builtin": item.builtin, "words": item.doc,
            "reads": sorted(item.reads) if item.reads is not None else None, "rechecked": item.rechecked,
        }
        for item in PLUGINS.filters
    ] + [
        {
            "kind": "scorer", "id": item.id, "order": item.order, "builtin": item.builtin, "words": item.doc,
            "reads": sorted(item.reads) if item.reads is not None else None, "rechecked": False,
        }
        for item in PLUGINS.scorers
    ]
    plain = PLUGINS.plain_path_reason() if PLUGINS.has_external else None
    return {
        "index": "kept" if plain is None else f"plain path: {plain}",
        "rules": rules,
        "loaded": list(PLUGINS.loaded),
        "errors": list(PLUGINS.errors),
    }


def passed_over_summary(rejections: Mapping[str, str], reasons: Mapping[str, int] | None = None) -> str:
    """``passed over (3 nodes): 2 × gpu: 8 requested, 0 free; 1 × …`` (at most five groups), or ``""``.
    ``reasons``: each reason's count where the planner kept it (Plan.reasons)."""
    if not rejections:
        return ""
    total = len(rejections)
    return f"passed over ({total} node{'' if total == 1 else 's'}): {reasons_grouped(rejections, reasons)}"


def placed_explain(plan: Plan, *, attempts: int, conflicts: list[str]) -> dict[str, Any]:
    """What a placed replica keeps: its shards, why there, and the rejections of the nodes ranked ahead."""
    kept = islice(plan.rejections.items(), KEPT_REJECTIONS)  # a lost room's plans pass 2,500 over
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
        "summary": passed_over_summary(plan.rejections, plan.reasons),
        "rejections": [{"node": n, "reason": r} for n, r in kept],
        "attempts": attempts,
        "conflicts": conflicts,
    }


def pending_explain(nofit: NoFit) -> dict[str, Any]:
    """What a pending replica keeps: the summary, its causes in a facility team's words (every node's
    rejection counted, not only the summary's first groups) and the first node reasons."""
    return {
        "summary": nofit.summary,
        "causes": nofit_causes(nofit.rejections),
        "nodes_checked": len(nofit.rejections),
        "rejections": [{"node": n, "reason": r} for n, r in islice(nofit.rejections.items(), KEPT_REJECTIONS)],
    }
