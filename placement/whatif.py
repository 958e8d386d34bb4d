"""What-if, before the maintenance window: a dry run of a hold (with drain) or a feed's loss on a copy.

Nothing is written: the state is read once (``placement.snapshot``) into a :class:`PlacementIndex`, and
the replicas that would leave are planned there by the same ``index.plan`` the real drain's
``replica_place`` calls, in the real drain's order — round after round, models by name, each model's
replicas by ordinal, one at a time per model, the original freed before the model's next one moves —
so the moves shown are the moves the drain makes while nothing else changes meanwhile.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from django.utils import timezone

from agents.node.protocol import value_shown
from facility.domains import parse_domain
from facility.feed_selectors import feed_loss_report
from facility.power import kw
from facility.services import clean_domain, domain_warning
from llmgw.errors import InvalidInput, NotFound
from placement import snapshot
from placement.index import PlacementIndex
from placement.models import Model, Shard
from placement.planner import NodeView, NoFit, ReplicaRequest


@dataclasses.dataclass
class _Leaving:
    replica_id: int
    name: str
    shards: list[dict[str, Any]]


def _without_shard(node: NodeView, shard: dict[str, Any]) -> NodeView:
    """The node once a shard stops on it: the reverse of ``planner.apply_shard``."""
    return dataclasses.replace(
        node,
        free_gpus=tuple(sorted(set(node.free_gpus) | set(shard["gpu_indices"] or []))),
        cpu_cores_free=node.cpu_cores_free + shard["cpu_cores"],
        memory_gib_free=node.memory_gib_free + shard["memory_gib"],
        placed_watts=max(0.0, node.placed_watts - (shard["draw_watts"] or 0)),
        replicas=max(0, node.replicas - 1),
    )


def _leaving(node_names: set[str]) -> dict[str, list[_Leaving]]:
    """Model name → the replicas with a shard on those nodes (originals only), by ordinal."""
    on = set(
        Shard.objects.filter(node__name__in=node_names, replica__replaces__isnull=True).values_list(
            "replica_id", flat=True
        )
    )
    rows = Shard.objects.filter(replica_id__in=on).values(
        "replica_id", "replica__ordinal", "replica__model__name", "node__name", "gpu_indices", "cpu_cores",
        "memory_gib", "draw_watts",
    ).order_by("replica__model__name", "replica__ordinal", "node__name")
    by_model: dict[str, dict[int, _Leaving]] = defaultdict(dict)
    for row in rows:
        model = row["replica__model__name"]
        item = by_model[model].setdefault(
            row["replica_id"], _Leaving(row["replica_id"], f"{model}#{row['replica__ordinal']}", [])
        )
        item.shards.append(row)
    return {model: list(items.values()) for model, items in sorted(by_model.items())}


def _domain_uses(index: PlacementIndex) -> dict[str, tuple[float, float]]:
    margin = index.facility.settings.margin
    return {
        str(domain): (index.use_watts(domain) or 0.0, budget.limit_watts(margin))
        for domain, budget in index.facility.budgets.items()
    }


def _domains_to_show(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> list[dict]:
    """The budgeted domains a dry run shows, level by level: those whose use it changes, and those past
    their limit after it (a drain may land beside one that is over already). The same rows for ctl's
    table, -o json, the API and the console's preview; every other domain is as it is now."""
    rows = []
    for d in snapshot.level_sorted(after):
        use_before, use_after, limit = round(before[d][0], 1), round(after[d][0], 1), round(after[d][1], 1)
        if use_before != use_after or use_after > limit:
            rows.append({"domain": d, "use_watts_before": use_before, "use_watts_after": use_after, "limit_watts": limit})
    return rows


def _run(index: PlacementIndex, leaving: dict[str, list[_Leaving]]) -> tuple[list[dict], list[dict]]:
    """Plan every leaving replica as the drain does; returns (moves, blocked)."""
    models = {m.name: m for m in Model.objects.filter(name__in=list(leaving))}
    existing = {name: list(snapshot.existing_replicas(models[name])) for name in leaving}
    moves: list[dict] = []
    blocked: list[dict] = []
    queues = {name: list(items) for name, items in leaving.items()}
    last_moved: dict[str, _Leaving] = {}

    def stopped(name: str) -> None:
        """The model's last replica moved: its replacement is up, the original stops and frees its room."""
        done = last_moved.pop(name, None)
        if done is not None:
            for shard in done.shards:
                index.update_node(_without_shard(index.node(shard["node__name"]), shard))
            origin = frozenset(s["node__name"] for s in done.shards)
            if origin in existing[name]:
                existing[name].remove(origin)

    while any(queues.values()):
        for name in sorted(queues):
            if not queues[name]:
                continue
            stopped(name)
            item = queues[name].pop(0)
            request = ReplicaRequest(
                model=name, profile=snapshot.profile_of(models[name]), existing=tuple(existing[name])
            )
            result = index.plan(request)
            source = sorted(s["node__name"] for s in item.shards)
            if isinstance(result, NoFit):
                # The drain waits here (one at a time per model): the model's later replicas wait behind it.
                blocked.append({"replica": item.name, "model": name, "from": source, "reason": result.summary})
                for later in queues[name]:
                    blocked.append({
                        "replica": later.name, "model": name, "from": sorted(s["node__name"] for s in later.shards),
                        "reason": f"waits for {item.name}, which cannot move",
                    })
                queues[name] = []
                continue
            index.apply(result)
            existing[name].append(result.nodes)
            last_moved[name] = item
            moves.append({"replica": item.name, "model": name, "from": source, "to": sorted(result.nodes),
                          "why": result.why})
    for name in sorted(last_moved):  # each model's last one stops too: the use after counts it gone
        stopped(name)
    return moves, blocked


def what_if(
    *, hold: str | None = None, drain: bool = False, feed: str | None = None, node: str | None = None,
    reason: str = "",
) -> dict[str, Any]:
    """A dry run of holding a domain (``drain``: and moving its replicas out) or of losing a feed.

    ``reason``: the hold's reason as the operator gave it, which the dry run's refusals quote (``rack r1-01
    is held: PDU swap``), as the real hold's would.

    Returns the moves (replica, from, to, why), the replicas blocked and why, the replicas that stay
    (a hold without drain), the budgeted domains whose use it changes or that end past their limit, each
    with its use before and after and its limit (:func:`_domains_to_show`), for a feed's loss the N−1 report, and for a hold the warnings holding it would give (:func:`hold_warnings`).
    Nothing is written.
    """
    if sum(scenario is not None for scenario in (hold, feed, node)) != 1:
        raise InvalidInput("what-if: name a domain to hold, a feed to lose or a node to cordon", field="scenario")
    now = timezone.now()
    facility = snapshot.facility_view()
    views = snapshot.node_views(now=now)
    out: dict[str, Any] = {}
    if hold is not None:
        domain = parse_domain(clean_domain(hold))
        # No reason given: the refusals say "rack r1-01 is held", as a hold's would (not "is held: held").
        facility = dataclasses.replace(facility, holds={**facility.holds, domain: reason.strip()})
        leaving_nodes = {v.name for v in views if domain in v.domains}
        out["scenario"] = f"hold {domain}{' --drain' if drain else ''}"
    elif node is not None:
        if node not in {v.name for v in views}:
            raise NotFound(f"node {value_shown(node)} is not known", field="node")
        leaving_nodes = {node}
        out["scenario"] = f"cordon {node}{' --drain' if drain else ''}"
    else:
        report = feed_loss_report(feed=feed)["feeds"][0]  # NotFound, naming the feeds, for one not known
        leaving_nodes = {n for v in report["violations"] for n in v["dark_nodes"]}
        drain = True  # a node without power runs nothing: its replicas must go
        out["scenario"] = f"feed-loss {feed}"
        out["feed_loss"], out["feed_carried"] = report["violations"], report["carried"]
    index = PlacementIndex(views, facility)
    if feed is not None:
        for name in leaving_nodes:
            # Nothing lands on a node left without power (a held node is refused by its hold already).
            index.update_node(dataclasses.replace(index.node(name), ready=False))
    if node is not None:
        index.update_node(dataclasses.replace(index.node(node), cordoned=True))
    before = _domain_uses(index)
    leaving = _leaving(leaving_nodes)
    if drain:
        moves, blocked = _run(index, leaving)
        stay: list[dict] = []
    else:
        moves, blocked = [], []
        stay = [{"replica": i.name, "model": m, "on": sorted(s["node__name"] for s in i.shards)}
                for m, items in leaving.items() for i in items]
    after = _domain_uses(index)
    out.update(
        {
            "nodes": sorted(leaving_nodes),
            "moves": moves,
            "blocked": blocked,
            "stay": stay,
            "domains": _domains_to_show(before, after),
        }
    )
    out.setdefault("feed_loss", [])
    out.setdefault("feed_carried", [])
    # A hold's dry run says what the hold itself would warn of (a name no node is in, a drain's trouble).
    out["warnings"] = [] if hold is None else hold_warnings(domain=str(domain), drain=drain, result=out)
    return out



def hold_result_warnings(result: dict[str, Any]) -> list[str]:
    """What a person should confirm in a hold's dry run: each domain its drain would take past its limit,
    with the figures, and each replica that could not move (the drain would wait there)."""
    warnings = []
    for d in result["domains"]:
        before, after, limit = d["use_watts_before"], d["use_watts_after"], d["limit_watts"]
        if after > limit and after > before:
            warnings.append(
                f"{d['domain']} would reach {kw(after)} of its {kw(limit)} limit ({kw(after - limit)} over; {kw(before)} now)"
            )
    for b in result["blocked"]:
        warnings.append(f"{b['replica']} could not move: {b['reason']}")
    return warnings


def hold_warnings(*, domain: str, drain: bool, result: dict[str, Any] | None = None) -> list[str]:
    """Every warning before holding `domain`: a name no node is in (a typo?), and with `drain` what the
    dry run finds (domains past their limit, replicas that cannot move); `result`: that dry run, when it
    was run already (placement.services.hold_preview). The console asks for confirmation with them; the
    API's `warning` and ctl say them."""
    warnings = []
    typo = domain_warning(domain=domain)
    if typo:
        warnings.append(typo)
    elif drain:
        warnings.extend(hold_result_warnings(result if result is not None else what_if(hold=domain, drain=True)))
    return warnings
