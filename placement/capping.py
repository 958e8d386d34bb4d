"""Capping: a warm (or hot, or nearly full) domain's GPUs asked to draw less, the gentler alternative to shedding.

Off unless server.yaml sets ``facility.capping.enabled``. After each evaluation of conditions
(:func:`capping_run`), every node in a domain that is warm or hot, or within 5 % of its power limit,
steps its GPUs down by ``step_fraction`` of their default limit, to ``floor_fraction`` at most; once
none of its domains has been in that state for ``restore_after`` it steps back up, to the defaults.
The wanted limit travels in the heartbeat answer (agents.readings' capping provider:
:func:`capping_blocks`); the agent applies it through NVML and reads back the enforced limit, which
placement's derived draw then counts (placement.snapshot.gpu_power_limit), so capping frees room.

Under observe mode (the domain's conditions mode) nothing is sent: ``would_fraction`` keeps what would
have been asked, and ``llmgw ctl facility capping`` says ``would cap gpu03 to 490 W (rack r12-07 warm)``.
A model's ``min_ready`` is untouched by capping: it stops nothing.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from agents.models import GPU, Node, NodeDomain
from agents.node.protocol import Capping, GpuCap, capping_answer
from facility.evaluation import effective_conditions
from facility.models import FacilitySettings
from facility.response import NEAR_LIMIT_FRACTION, CappingConfig, parse_capping_config
from facility.selectors import facility_overview
from placement.models import NodeCap
from placement.signals import placement_changed_on_commit

# The top SM clock of a Hopper SXM card: a locked-clocks cap asks for this share of it (the agent holds
# the lock below the card's own top clock whatever is asked).
TOP_SM_CLOCK_MHZ = 1980
LOWEST_LOCKED_CLOCK_MHZ = 210
LEVEL_ORDER = {"pdu": 0, "rack": 1, "row": 2, "room": 3, "site": 4}
CLOSE = 1e-9


def capping_config() -> CappingConfig:
    """The stored facility.capping (validated when applied)."""
    return parse_capping_config(FacilitySettings.load().capping or None)


def _default_limits() -> dict[int, float]:
    """Node id → its GPUs' default power limit (the largest card's): read back by the agent, else inventory."""
    found: dict[int, float] = {}
    for node_id, watts in GPU.objects.filter(present=True).exclude(power_limit_watts=None).values_list(
        "node_id", "power_limit_watts"
    ):
        found[node_id] = max(found.get(node_id, 0.0), watts)
    for node_id, sensors in Node.objects.exclude(sensors=None).values_list("id", "sensors"):
        defaults = [g["default_power_limit_watts"] for g in (sensors or {}).get("gpus") or ()
                    if g.get("default_power_limit_watts") is not None]
        if defaults:
            found[node_id] = max(defaults)
    return found


def _pressed_domains(now: datetime) -> dict[str, tuple[str, bool]]:
    """Domain → (why capping acts there, under enforce mode?): warm or hot, or within 5 % of its limit."""
    conditions = effective_conditions(now=now)
    found: dict[str, tuple[str, bool]] = {}
    for domain in facility_overview()["domains"]:
        text = domain["domain"]
        state = conditions.get(text) or {}
        words = text.replace(":", " ", 1)
        enforce = bool(state.get("enforce"))
        if state.get("condition") in ("warm", "hot"):
            found[text] = (f"{words} {state['condition']}", enforce)
        elif domain["limit_watts"] and domain["use_watts"] >= domain["limit_watts"] * (1 - NEAR_LIMIT_FRACTION):
            found[text] = (f"{words} within {NEAR_LIMIT_FRACTION:.0%} of its power limit", enforce)
    return found


def capping_run(*, now: datetime | None = None, config: CappingConfig | None = None) -> list[dict[str, Any]]:
    """One step of every node's cap, down where its domain is pressed, up where it has been ok a while.

    Returns what changed (``{node, fraction, watts, reason, sent}``). With capping off, every cap is lifted.
    """
    now = now or timezone.now()
    config = config or capping_config()
    rows = {row.node_id: row for row in NodeCap.objects.all()}
    if not config.enabled:
        if rows:
            NodeCap.objects.all().delete()
            placement_changed_on_commit()
        return []
    pressed = _pressed_domains(now)
    where: dict[int, list[str]] = {}
    for node_id, domain in NodeDomain.objects.filter(domain__in=list(pressed)).values_list("node_id", "domain"):
        where.setdefault(node_id, []).append(domain)
    defaults = _default_limits()
    names = dict(Node.objects.values_list("id", "name"))
    changes: list[dict[str, Any]] = []
    sent = False
    for node_id in sorted(set(where) | set(rows), key=lambda i: names.get(i, "")):
        row = rows.get(node_id) or NodeCap(node_id=node_id)
        before = (row.fraction, row.would_fraction)
        domains = sorted(where.get(node_id, ()), key=lambda d: (LEVEL_ORDER.get(d.split(":")[0], 9), d))
        if domains:
            reason, enforce = pressed[domains[0]]
            row.reason = reason
            row.ok_since = None
            if enforce:
                row.fraction = max(config.floor_fraction, row.fraction - config.step_fraction)
                row.would_fraction = row.fraction
            else:
                row.would_fraction = max(config.floor_fraction, row.would_fraction - config.step_fraction)
        else:
            row.ok_since = row.ok_since or now
            if now - row.ok_since >= timedelta(seconds=config.restore_after):
                row.fraction = min(1.0, row.fraction + config.step_fraction)
                row.would_fraction = min(1.0, row.would_fraction + config.step_fraction)
        if row.fraction >= 1 - CLOSE and row.would_fraction >= 1 - CLOSE:
            if row.pk is not None and NodeCap.objects.filter(pk=node_id).exists():
                NodeCap.objects.filter(pk=node_id).delete()
                sent = sent or before[0] < 1 - CLOSE
                changes.append({"node": names.get(node_id), "fraction": 1.0, "watts": None,
                                "reason": "restored", "sent": True})
            continue
        row.save()
        if (row.fraction, row.would_fraction) != before:
            enforced = abs(row.fraction - before[0]) > CLOSE
            sent = sent or enforced
            fraction = row.fraction if enforced else row.would_fraction
            default = defaults.get(node_id)
            changes.append({"node": names.get(node_id), "fraction": round(fraction, 4),
                            "watts": round(default * fraction) if default else None,
                            "reason": row.reason, "sent": enforced})
    if sent:
        placement_changed_on_commit()  # the heartbeat answers carry the new block from the next refresh
    return changes


def capping_blocks() -> dict[str, dict]:
    """Every capped node's answer block (node name → block): the capping provider of agents.readings."""
    config = capping_config()
    if not config.enabled:
        return {}
    rows = list(NodeCap.objects.filter(fraction__lt=1 - CLOSE).values_list("node_id", "node__name", "fraction"))
    if not rows:
        return {}
    defaults = _default_limits()
    blocks: dict[str, dict] = {}
    for node_id, name, fraction in rows:
        if config.lever == "locked_clocks":
            top = max(LOWEST_LOCKED_CLOCK_MHZ, round(TOP_SM_CLOCK_MHZ * fraction))
            cap = GpuCap(locked_clocks_mhz=(LOWEST_LOCKED_CLOCK_MHZ, top))
        elif node_id in defaults:
            cap = GpuCap(power_limit_watts=round(defaults[node_id] * fraction))
        else:
            continue  # no known default limit: nothing to take a share of
        blocks[name] = capping_answer(Capping(config.lever, all=cap))
    return blocks


def capping_rows() -> list[dict[str, Any]]:
    """Each node capping acts on: capped (sent) or would-cap (observe), the limit in words, and why."""
    config = capping_config()
    defaults = _default_limits()
    out = []
    for row in NodeCap.objects.select_related("node").order_by("node__name"):
        default = defaults.get(row.node_id)
        capped = row.fraction < 1 - CLOSE
        fraction = row.fraction if capped else row.would_fraction
        if config.lever == "locked_clocks":
            value = f"{max(LOWEST_LOCKED_CLOCK_MHZ, round(TOP_SM_CLOCK_MHZ * fraction))} MHz"
        else:
            value = f"{round(default * fraction)} W" if default else f"{fraction:.0%} of its default limit"
        verb = "capped" if capped else "would cap"
        why = row.reason or ("ok since " + row.ok_since.isoformat()[:19] if row.ok_since else "")
        text = f"{'capped' if capped else 'would cap'} {row.node.name} to {value} ({why})"
        if capped:
            text = f"{row.node.name} capped to {value} ({why})"
        out.append({"node": row.node.name, "state": verb, "fraction": round(fraction, 4), "limit": value,
                    "reason": why, "text": text, "lever": config.lever})
    return out


def capping_listing() -> dict[str, Any]:
    """What ``llmgw ctl facility capping`` and ``GET /api/v1/facility/capping`` show: whether capping is on,
    its lever, and :func:`capping_rows`."""
    config = capping_config()
    return {"enabled": config.enabled, "lever": config.lever, "nodes": capping_rows()}
