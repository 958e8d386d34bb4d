"""Capping: a warm (or hot, or nearly full) domain's GPUs asked to draw less, the gentler alternative to shedding.

Off unless server.yaml sets ``facility.capping.enabled``. After each evaluation of conditions
(:func:`capping_run`), every node in a domain that is warm or hot, or within 5 % of its power limit,
steps its GPUs down by ``step_fraction`` of their default limit (under the ``locked_clocks`` lever, of
each card's own top SM clock), to ``floor_fraction`` at most; once none of its domains has been in that
state for ``restore_after`` it steps back up, to the defaults.
The wanted limit travels in the heartbeat answer (agents.readings' capping provider:
:func:`capping_blocks`); the agent applies it through NVML and reads back the enforced limit, which
placement's derived draw then counts (placement.snapshot.gpu_power_limit), so capping frees room.

Under observe mode (the domain's conditions mode) nothing is sent: ``would_fraction`` keeps what would
have been asked, and ``llmgw ctl facility capping`` says ``would cap gpu03 to 490 W (rack r12-07 warm)``.
A model's ``min_ready`` is untouched by capping: it stops nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone

from agents.models import GPU, Node, NodeDomain
from agents.node.protocol import Capping, GpuCap, capping_answer
from facility.models import FacilitySettings
from facility.response import CappingConfig, parse_capping_config
from placement.decisions.capping import CLOSE, CapNode, NodeCapState, cap_step, pressed_domains
from placement.models import NodeCap
from placement.planner import gpus_text
from placement.shedding import domain_states
from placement.signals import placement_changed_on_commit

# A locked-clocks cap asks each card for its share of its own top SM clock, which the agent reports
# (`max_sm_clock_mhz`). Where no top is known (an agent too old to report it) a Hopper SXM card's is assumed,
# and said so: the agent holds the lock below the card's real top, so on a card that tops out lower such a
# cap may ask for nothing it does not already run at.
FALLBACK_TOP_SM_CLOCK_MHZ = 1980
LOWEST_LOCKED_CLOCK_MHZ = 210


def capping_config() -> CappingConfig:
    """The stored facility.capping (validated when applied)."""
    return parse_capping_config(FacilitySettings.load().capping or None)


def _default_limits(node_ids: list[int] | None = None) -> dict[int, float]:
    """Node id → its GPUs' default power limit (the largest card's): read back by the agent, else inventory.

    Of `node_ids` only, when given (the capped nodes: not every node's sensors)."""
    found: dict[int, float] = {}
    gpus = GPU.objects.filter(present=True).exclude(power_limit_watts=None)
    nodes = Node.objects.exclude(sensors=None)
    if node_ids is not None:
        gpus, nodes = gpus.filter(node_id__in=node_ids), nodes.filter(id__in=node_ids)
    for node_id, watts in gpus.values_list("node_id", "power_limit_watts"):
        found[node_id] = max(found.get(node_id, 0.0), watts)
    for node_id, sensors in nodes.values_list("id", "sensors"):
        defaults = [g["default_power_limit_watts"] for g in (sensors or {}).get("gpus") or ()
                    if g.get("default_power_limit_watts") is not None]
        if defaults:
            found[node_id] = max(defaults)
    return found


def capping_run(*, now: datetime | None = None, config: CappingConfig | None = None) -> list[dict[str, Any]]:
    """One step of every node's cap, down where its domain is pressed, up where it has been ok a while.

    Returns what changed (``{node, fraction, watts, reason, sent}``). With capping off, every cap is lifted.
    The step is :func:`placement.decisions.capping.cap_step`'s; this reads for it and writes what it decides.
    """
    now = now or timezone.now()
    config = config or capping_config()
    rows = {row.node_id: row for row in NodeCap.objects.all()}
    if not config.enabled:
        if rows:
            NodeCap.objects.all().delete()
            placement_changed_on_commit()
        return []
    pressed = pressed_domains(domain_states(now=now))
    where: dict[int, list[str]] = {}
    for node_id, domain in NodeDomain.objects.filter(domain__in=list(pressed)).values_list("node_id", "domain"):
        where.setdefault(node_id, []).append(domain)
    defaults = _default_limits()
    names = dict(Node.objects.values_list("id", "name"))
    step = cap_step(
        nodes=[
            CapNode(
                node_id, names.get(node_id), _cap_state(rows[node_id]) if node_id in rows else None,
                tuple(where.get(node_id, ())), defaults.get(node_id),
            )
            for node_id in set(where) | set(rows)
        ],
        pressed=pressed, config=config, now=now,
    )
    if step.release:
        NodeCap.objects.filter(pk__in=step.release).delete()
    for node_id, cap in step.keep.items():
        row = rows.get(node_id) or NodeCap(node_id=node_id)
        row.fraction, row.would_fraction = cap.fraction, cap.would_fraction
        row.reason, row.ok_since = cap.reason, cap.ok_since
        row.save()
    if step.sent:
        placement_changed_on_commit()  # the heartbeat answers carry the new block from the next refresh
    elif step.shown:
        # Only what would be capped, or why, changed: no node's answer differs (no node named), but the
        # console's Facility page lists it and renders again.
        placement_changed_on_commit(nodes=[])
    return [change.as_dict() for change in step.changes]


def _cap_state(row: NodeCap) -> NodeCapState:
    return NodeCapState(row.fraction, row.would_fraction, row.reason, row.ok_since)


def _gpu_top_clocks(node_ids: list[int]) -> dict[int, list[tuple[int, str | None, int | None]]]:
    """Node id → its GPUs as its last sensors report them: (index, uuid, top SM clock or None)."""
    found: dict[int, list[tuple[int, str | None, int | None]]] = {}
    for node_id, sensors in Node.objects.filter(id__in=node_ids).exclude(sensors=None).values_list("id", "sensors"):
        found[node_id] = [(g["index"], g.get("uuid"), g.get("max_sm_clock_mhz")) for g in (sensors or {}).get("gpus") or ()]
    return found


def locked_clock_mhz(top_mhz: int, fraction: float) -> int:
    """The highest SM clock a card whose top is `top_mhz` is locked to at `fraction` of it (210 MHz at least)."""
    return max(LOWEST_LOCKED_CLOCK_MHZ, round(top_mhz * fraction))


@dataclass(frozen=True)
class ClockLock:
    """Some GPUs of a node locked alike: their indexes, the top SM clock (reported, or assumed) and the lock."""

    gpus: tuple[int, ...]
    top_mhz: int
    top_reported: bool
    locked_mhz: int


def clock_locks(
    gpus: list[tuple[int, str | None, int | None]], fraction: float
) -> tuple[Capping, list[ClockLock]]:
    """A node's locked-clocks block at `fraction`, and its locks grouped by top clock (for the rows).

    One top on every GPU (or none known): `all` at its share. Tops that differ: each GPU by uuid at the
    share of its own, and `all` at the assumed top for those that report none (a GPU without a uuid can
    only be reached through `all`)."""
    tops = {top for _, _, top in gpus}
    if len(tops) > 1:
        gpus = [(index, uuid, top if uuid else None) for index, uuid, top in gpus]
    grouped: dict[int | None, list[int]] = {}
    for index, _, top in sorted(gpus, key=lambda g: g[0]):
        grouped.setdefault(top, []).append(index)
    if not grouped:
        grouped[None] = []  # no GPU reported at all: the whole node at the assumed top
    locks = [
        ClockLock(tuple(indexes), top or FALLBACK_TOP_SM_CLOCK_MHZ, top is not None,
                  locked_clock_mhz(top or FALLBACK_TOP_SM_CLOCK_MHZ, fraction))
        for top, indexes in grouped.items()
    ]
    locks.sort(key=lambda lock: lock.gpus[:1])
    if len(locks) == 1:
        return Capping("locked_clocks", all=GpuCap(locked_clocks_mhz=(LOWEST_LOCKED_CLOCK_MHZ, locks[0].locked_mhz))), locks
    per_gpu = {
        uuid: GpuCap(locked_clocks_mhz=(LOWEST_LOCKED_CLOCK_MHZ, locked_clock_mhz(top, fraction)))
        for _, uuid, top in gpus
        if uuid and top
    }
    assumed = None in grouped
    every = GpuCap(locked_clocks_mhz=(LOWEST_LOCKED_CLOCK_MHZ, locked_clock_mhz(FALLBACK_TOP_SM_CLOCK_MHZ, fraction)))
    return Capping("locked_clocks", all=every if assumed else None, gpus=per_gpu), locks


def capping_blocks() -> dict[str, dict]:
    """Every capped node's answer block (node name → block): the capping provider of agents.readings."""
    config = capping_config()
    if not config.enabled:
        return {}
    rows = list(NodeCap.objects.filter(fraction__lt=1 - CLOSE).values_list("node_id", "node__name", "fraction"))
    if not rows:
        return {}
    blocks: dict[str, dict] = {}
    if config.lever == "locked_clocks":
        tops = _gpu_top_clocks([node_id for node_id, _, _ in rows])
        for node_id, name, fraction in rows:
            blocks[name] = capping_answer(clock_locks(tops.get(node_id, []), fraction)[0])
        return blocks
    defaults = _default_limits([node_id for node_id, _, _ in rows])
    for node_id, name, fraction in rows:
        if node_id not in defaults:
            continue  # no known default limit: nothing to take a share of
        blocks[name] = capping_answer(Capping(config.lever, all=GpuCap(power_limit_watts=round(defaults[node_id] * fraction))))
    return blocks


def _gpu_list(indexes: tuple[int, ...]) -> str:
    """GPU indexes in words: `GPU 3`, `GPUs 0-3`, `GPUs 0,2,4-7`."""
    return f"GPU {gpus_text(indexes)}" if len(indexes) == 1 else f"GPUs {gpus_text(indexes)}"


def _clock_words(locks: list[ClockLock]) -> tuple[str, str]:
    """The lock in words (`1128 MHz`, or per GPUs where tops differ) and what is assumed, if anything."""
    if len(locks) == 1:
        value = f"{locks[0].locked_mhz} MHz"
    else:
        value = ", ".join(f"{lock.locked_mhz} MHz on {_gpu_list(lock.gpus)}" for lock in locks)
    assumed = [lock for lock in locks if not lock.top_reported]
    if not assumed:
        return value, ""
    whose = "" if len(locks) == 1 else f" for {_gpu_list(assumed[0].gpus)}"
    return value, f"no top SM clock reported{whose}: {FALLBACK_TOP_SM_CLOCK_MHZ} MHz assumed"


def capping_rows() -> list[dict[str, Any]]:
    """Each node capping acts on: capped (sent) or would-cap (observe), the limit in words, and why.

    Under the locked-clocks lever the limit is each card's share of its own top SM clock, per GPUs where
    a node's cards differ, and the row says where a top had to be assumed (`note`, else "")."""
    config = capping_config()
    # Of the node its name only: its sensors document (~3 KB) is read, where needed, for its GPUs' defaults.
    caps = list(
        NodeCap.objects.select_related("node").only("fraction", "would_fraction", "reason", "ok_since", "node__name")
        .order_by("node__name")
    )
    clocks = config.lever == "locked_clocks"
    defaults = {} if clocks else _default_limits([row.node_id for row in caps])
    tops = _gpu_top_clocks([row.node_id for row in caps]) if clocks else {}
    out = []
    for row in caps:
        capped = row.fraction < 1 - CLOSE
        fraction = row.fraction if capped else row.would_fraction
        note = ""
        extra: dict[str, Any] = {}
        if clocks:
            _, locks = clock_locks(tops.get(row.node_id, []), fraction)
            value, note = _clock_words(locks)
            extra["locked_clocks"] = [
                {"gpus": list(lock.gpus), "max_sm_clock_mhz": lock.top_mhz, "top_reported": lock.top_reported,
                 "locked_clocks_mhz": [LOWEST_LOCKED_CLOCK_MHZ, lock.locked_mhz]}
                for lock in locks
            ]
        else:
            default = defaults.get(row.node_id)
            value = f"{round(default * fraction)} W" if default else f"{fraction:.0%} of its default limit"
        verb = "capped" if capped else "would cap"
        why = row.reason or ("ok since " + row.ok_since.isoformat()[:19] if row.ok_since else "")
        text = f"{row.node.name} capped to {value} ({why})" if capped else f"would cap {row.node.name} to {value} ({why})"
        if note:
            text += f"; {note}"
        out.append({"node": row.node.name, "state": verb, "fraction": round(fraction, 4), "limit": value,
                    "reason": why, "note": note, "text": text, "lever": config.lever, **extra})
    return out


def capping_listing() -> dict[str, Any]:
    """What ``llmgw ctl facility capping`` and ``GET /api/v1/facility/capping`` show: whether capping is on,
    its lever, and :func:`capping_rows`."""
    config = capping_config()
    return {"enabled": config.enabled, "lever": config.lever, "nodes": capping_rows()}
