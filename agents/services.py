"""Writes to nodes: store labels, cordons, node tokens, and what a heartbeat reports.

Kept in one module past 600 lines for now: every write here takes the node's row in the one order the
guarded commit relies on (llmgw.lock_order: budgets, then nodes; ``_node_locked``), and the heartbeat's record, the
inventory it holds back for an operator and the labels share that path. The inventory confirmation
(``_inventory_pending`` … ``node_max_draw_set``) is the part to move out first, with its lock use.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
from collections.abc import Callable, Collection, Mapping
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from agents import signals
from agents.models import GPU, Node, NodeDomain, NodeToken, StoreLabel, measured_peak_of
from agents.node.protocol import (
    MAX_LABELS,
    control_character_problem,
    is_node_name,
    node_name_problem,
    value_shown,
)
from facility.domains import (
    LOCATION_KEYS,
    DomainError,
    agent_location_keys,
    domains_of,
    effective_labels,
    location_conflicts,
    validate_label,
)
from llmgw.errors import Conflict, InvalidInput, NotFound
from llmgw.lock_order import rows_locked

log = logging.getLogger(__name__)


def _nodes_changed(*node_names: str, heartbeat: bool = False, domains_moved: bool = True) -> None:
    """Tell the layers above (placement reconciles) that nodes it depends on changed; ``heartbeat``
    says a heartbeat found it (a node joined, came back or reported new labels or GPUs), ``domains_moved``
    whether a node's domains may have changed (the caps its feeds give follow only then)."""
    signals.nodes_changed.send(sender=Node, node_names=node_names, heartbeat=heartbeat, domains_moved=domains_moved)


def clean_node_name(name: Any, field: str = "node") -> str:
    if not is_node_name(name):
        raise InvalidInput(f"{field}: {node_name_problem(name)}", field=field)
    return name


# server.yaml's facility.location_from, read through a function the facility app registers in its ready()
# (this layer may not import facility's models); None until then: every location label from the agents.
_location_from_reader: Callable[[], Mapping[str, str]] | None = None


def register_location_from_reader(reader: Callable[[], Mapping[str, str]] | None) -> None:
    """Set the function that reads facility.location_from ({level: "agents" | "store"})."""
    global _location_from_reader
    _location_from_reader = reader


def trusted_location_keys() -> frozenset[str]:
    """The location keys an agent's value is taken for (facility.location_from's `agents` levels)."""
    if _location_from_reader is None:
        return frozenset(LOCATION_KEYS)
    return agent_location_keys(_location_from_reader())


def node_refresh_labels(
    node: Node, *, store: Mapping[str, str] | None = None, trusted: Collection[str] | None = None
) -> bool:
    """Recompute a node's effective labels, its domains and its location conflicts from the agent's labels,
    the store's and which location keys are the agent's to say (facility.location_from); True when its
    domains changed. ``store`` and ``trusted`` are read when not given."""
    if store is None:
        store = dict(StoreLabel.objects.filter(node_name=node.name).values_list("key", "value"))
    if trusted is None:
        trusted = trusted_location_keys()
    agent = node.agent_labels or {}
    labels = effective_labels(agent, store, trusted)
    conflicts = location_conflicts(agent, store, trusted)
    changed = []
    if labels != node.labels:
        node.labels = labels
        changed.append("labels")
    if conflicts != (node.location_conflicts or []):
        # Logged once per change, not at every heartbeat: the node page and its API show them meanwhile.
        if conflicts:
            log.warning("node %s: %s", node.name, "; ".join(conflicts))
        else:
            log.info("node %s: its agent's location agrees with the store again", node.name)
        node.location_conflicts = conflicts
        changed.append("location_conflicts")
    if changed:
        node.save(update_fields=changed)
    domains = {str(d): d.level for d in domains_of(labels)}
    current = set(node.domains.values_list("domain", flat=True))
    if current == set(domains):
        return False
    node.domains.exclude(domain__in=domains).delete()
    NodeDomain.objects.bulk_create(
        [NodeDomain(node=node, domain=d, level=lvl) for d, lvl in domains.items() if d not in current]
    )
    return True


def _domains_joining(
    name: str, *, agent: Mapping[str, str] | None = None, store: Mapping[str, str] | None = None,
    trusted: Collection[str] | None = None, changes: Mapping[str, str | None] | None = None,
) -> set[str] | None:
    """Before a node's row is locked to write its labels: the domains its labels would put it in that it
    is not in yet (read without locks) go to the facility, which locks their budgets first; returned
    (None: no relabel seen, a node not known yet or an agent's labels as the row has them).

    A placement's commit locks budgets, then nodes; a relabel holding the node while it waited for a
    budget would wait on a commit that waits on it. What changes between this read and the node's lock
    (an agent's or the store's labels meanwhile) is found once the row is locked (_node_locked).
    ``agent`` (the agent's labels: none read when they are the node's already), ``store`` and
    ``trusted`` are read when not given; ``changes``, the store's changes about to be
    written (sent before they are: a relabel holding a store label's row while it waited for a budget
    would wait on a change that holds the budget and waits for that row). A node not known yet is in no
    domain (and nothing waits on its row). Several nodes relabelled in one transaction: the caller locks
    the budgets first (facility.feed_services.budgets_locked), as one node's locks would come after
    another's."""
    row = Node.objects.filter(name=name).values_list("pk", "agent_labels").first()
    if row is None or (agent is not None and agent == (row[1] or {})):
        return None
    if store is None:
        store = dict(StoreLabel.objects.filter(node_name=name).values_list("key", "value"))
    if changes:
        store = {key: value for key, value in {**store, **changes}.items() if value is not None}
    if trusted is None:
        trusted = trusted_location_keys()
    labels = effective_labels(row[1] or {} if agent is None else agent, store, trusted)
    joining = _joining(row[0], labels)
    if joining:
        signals.domains_joining.send(sender=Node, domains=sorted(joining))
    return joining


def _joining(node_id: int, labels: Mapping[str, str]) -> set[str]:
    """The domains these labels put the node in that it is not in yet."""
    return {str(d) for d in domains_of(labels)} - set(
        NodeDomain.objects.filter(node_id=node_id).values_list("domain", flat=True)
    )


# A relabel's tries in a savepoint; the last goes on with the labels its locked row gives (labels changing
# under it that often are an agent at odds with the store: the domains' trigger locks what is left).
_JOIN_TRIES = 3


class _JoinsMore(Exception):
    """The locked row's labels join domains whose budgets were not locked before it (_node_locked)."""

    def __init__(self, domains: set[str]):
        super().__init__(sorted(domains))
        self.domains = domains


def _node_locked(
    step: Callable[[], tuple[Node | None, bool]], locked: set[str] | None, *,
    agent: Mapping[str, str] | None = None,
) -> Node | None:
    """The node's row, locked by ``step``, once the budgets of every domain its labels join are locked
    before it.

    ``step`` writes what the node's labels come from (the store's) and locks the row; it returns the node
    (None: not known) and whether its labels may change (a node just made is in no domain: nothing waits
    on its row). ``agent``: the agent's labels about to be written (the row's when None). ``locked``: the
    domains whose budgets _domains_joining locked, from a read before the row's lock (None: that read saw
    no relabel, and ``step`` runs once). Labels changed in between (a heartbeat's under a store change, or
    the other way round) may join a domain more: ``step``'s savepoint is rolled back, which lets go of the
    row, those budgets are locked, and ``step`` runs again. Only PostgreSQL has the row locks to order.
    """
    if locked is not None and connection.vendor == "postgresql":
        for _ in range(_JOIN_TRIES - 1):
            try:
                with transaction.atomic():
                    node, may_change = step()
                    if node is not None and may_change:
                        store = dict(StoreLabel.objects.filter(node_name=node.name).values_list("key", "value"))
                        labels = effective_labels(
                            node.agent_labels or {} if agent is None else agent, store, trusted_location_keys()
                        )
                        joining = _joining(node.pk, labels) - locked
                        if joining:
                            raise _JoinsMore(joining)
                    return node
            except _JoinsMore as more:
                signals.domains_joining.send(sender=Node, domains=sorted(more.domains))
                locked = locked | more.domains
    node, _ = step()
    return node


def nodes_refresh_labels() -> list[str]:
    """Every node's effective labels again (facility.location_from changed); the names of the nodes whose
    domains changed, which placement and the feeds' caps are told of.

    Read first without locks; a node whose labels or conflicts change is then locked and refreshed in a
    transaction of its own, as labels_set does (a heartbeat changing its agent's labels meanwhile is not
    overwritten), so the fleet is never locked whole."""
    trusted = trusted_location_keys()
    store: dict[str, dict[str, str]] = {}
    for name, key, value in StoreLabel.objects.values_list("node_name", "key", "value"):
        store.setdefault(name, {})[key] = value
    moved = []
    for node in Node.objects.only("id", "name", "agent_labels", "labels", "location_conflicts").order_by("name"):
        agent, own = node.agent_labels or {}, store.get(node.name, {})
        if effective_labels(agent, own, trusted) == node.labels and location_conflicts(
            agent, own, trusted
        ) == (node.location_conflicts or []):
            continue
        with transaction.atomic():
            joining = _domains_joining(node.name, store=own, trusted=trusted)
            rows = rows_locked(Node.objects.filter(pk=node.pk))
            locked = _node_locked(lambda rows=rows: (rows.first(), True), joining)
            if locked is not None and node_refresh_labels(locked, trusted=trusted):
                moved.append(locked.name)
                _notify(locked.name)
    if moved:
        _nodes_changed(*moved)
    return moved


def labels_check(*, changes: Mapping[str, str | None]) -> None:
    """Store label changes checked (keys and values), or InvalidInput naming the label; writes nothing."""
    if not changes:
        raise InvalidInput("labels: give at least one key=value or key-", field="labels")
    if len(changes) > MAX_LABELS:
        # As many as a heartbeat may carry: one request's work stays bounded (each is a row written).
        raise InvalidInput(
            f"labels: at most {MAX_LABELS} in one change (got {len(changes):,})", field="labels"
        )
    for key, value in changes.items():
        if not isinstance(key, str):
            raise InvalidInput(f"labels: a key must be text, not {key!r}", field="labels")
        if value is None:
            continue
        try:
            validate_label(key, value)
        except DomainError as exc:
            raise InvalidInput(f"labels: {exc}", field=f"labels.{key}") from exc


# Names with store labels that no node has joined under yet (labels may be set before a node joins).
MAX_NODES_WAITING = 10_000


@transaction.atomic
def labels_set(
    *, node_name: str, changes: Mapping[str, str | None], set_by: str = "", waiting_bound: bool = True
) -> dict[str, str]:
    """Set (value) or remove (None) store labels of a node, known yet or not. All or nothing.

    ``waiting_bound``: refuse labels for one more name no node has joined under past MAX_NODES_WAITING
    (a NetBox import names its site's devices before they join: NetBox's own size bounds it).

    Returns the node's effective labels after the change (the store's alone when the node has not joined).
    """
    node_name = clean_node_name(node_name)
    labels_check(changes=changes)
    # The budgets of the domains it joins first, before any row of the node's (a commit's order).
    joining = _domains_joining(node_name, changes=changes)
    named = waiting_bound and StoreLabel.objects.filter(node_name=node_name).exists()  # in the store already

    def write() -> tuple[Node | None, bool]:
        for key, value in changes.items():
            if value is None:
                StoreLabel.objects.filter(node_name=node_name, key=key).delete()
            else:
                StoreLabel.objects.update_or_create(
                    node_name=node_name, key=key, defaults={"value": value, "set_by": set_by}
                )
        # Locked, so a heartbeat changing the agent's labels at the same time is not overwritten, and a
        # placement's commit (which locks the node) sees the new location.
        node = rows_locked(Node.objects.filter(name=node_name)).first()
        # Counted once the row is locked: another change of the node's labels has committed by then.
        held = StoreLabel.objects.filter(node_name=node_name).count()
        if held > MAX_LABELS:  # as many as its heartbeat may carry; each is a row, and in every view of it
            raise InvalidInput(
                f"labels: {node_name} would have {held:,} store labels; at most {MAX_LABELS} (remove some: key-)",
                field="labels",
            )
        return node, True

    node = _node_locked(write, joining)
    if node is None and waiting_bound and not named and any(value is not None for value in changes.values()):
        waiting = (
            StoreLabel.objects.exclude(node_name__in=Node.objects.values("name")).values("node_name").distinct().count()
        )
        if waiting > MAX_NODES_WAITING:  # rows no node reads yet, nor any listing of nodes shows
            raise InvalidInput(
                f"labels: {waiting:,} names no node has joined under hold store labels; at most "
                f"{MAX_NODES_WAITING:,} (remove some with KEY-, or let those nodes join first)",
                field="node",
            )
    if node is None:
        return dict(StoreLabel.objects.filter(node_name=node_name).values_list("key", "value"))
    node_refresh_labels(node)
    _nodes_changed(node.name)
    _notify(node.name)
    return node.labels


def store_labels_waiting_set(*, changes: Mapping[str, Mapping[str, str | None]], set_by: str = "") -> list[str]:
    """Set or remove the store labels of many names in one write where no node has joined under the name
    (a DCIM import labels a site's devices before they join), inside the caller's transaction; the names
    that have joined are returned, for :func:`labels_set` one by one (their rows and domains lock)."""
    joined = set(Node.objects.filter(name__in=list(changes)).values_list("name", flat=True))
    waiting = {name: change for name, change in changes.items() if name not in joined}
    for name, change in waiting.items():
        clean_node_name(name)
        labels_check(changes=change)
    gone = [(n, k) for n, change in waiting.items() for k, v in change.items() if v is None]
    for name, keys in itertools.groupby(sorted(gone), key=lambda nk: nk[0]):
        StoreLabel.objects.filter(node_name=name, key__in=[k for _, k in keys]).delete()
    rows = [StoreLabel(node_name=n, key=k, value=v, set_by=set_by)
            for n, change in sorted(waiting.items()) for k, v in sorted(change.items()) if v is not None]
    StoreLabel.objects.bulk_create(
        rows, batch_size=500, update_conflicts=True, unique_fields=["node_name", "key"],
        update_fields=["value", "set_by", "updated_at"],
    )
    return sorted(joined)


@transaction.atomic
def node_cordon(*, node_name: str, cordoned: bool, reason: str = "", drain: bool = False) -> Node:
    """Cordon (nothing new placed) or uncordon a node; drain also moves its replicas out, replacement first.

    Uncordoning stops a drain: replicas already moved stay where they are.
    """
    if not isinstance(reason, str | None):
        raise InvalidInput("reason: must be text", field="reason")
    reason = (reason or "").strip()  # as a hold's: blanks alone (a no-break space) are no reason
    if len(reason) > 500:
        raise InvalidInput("reason: at most 500 characters", field="reason")
    problem = control_character_problem(reason)
    if problem is not None:
        raise InvalidInput(f"reason: {problem}", field="reason")
    node = rows_locked(Node.objects.filter(name=node_name)).first()
    if node is None:
        raise NotFound(f"node {value_shown(node_name)} is not known", field="node")
    node.cordoned = cordoned
    node.cordon_reason = reason if cordoned else ""
    node.draining = cordoned and (drain or node.draining)
    node.save(update_fields=["cordoned", "cordon_reason", "draining"])
    _nodes_changed(node.name)
    _notify(node.name)
    return node


@transaction.atomic
def node_token_create(*, node_name: str) -> str:
    """A new token for a node's agent (replacing any earlier one); the key is shown once, only its hash kept.

    A node the demo simulates gets it too (agents.simulator.tokens), once it is the node's token, so the
    simulated node keeps heartbeating."""
    node_name = clean_node_name(node_name)
    key = NodeToken.new_key()
    NodeToken.objects.update_or_create(node_name=node_name, defaults={"key_hash": NodeToken.hash_key(key)})
    # Re-registered: its next heartbeat's cards are taken as they are (and take the full path to be).
    if Node.objects.filter(name=node_name).update(inventory_open=True, report_digest=""):
        from agents import readings

        readings.forget(node_name)  # as _forget_report does
        transaction.on_commit(lambda: readings.forget(node_name))
    from agents.authentication import forget_node_tokens

    forget_node_tokens()
    transaction.on_commit(lambda: _simulated_token_hand_over(node_name, key))
    return key


def _simulated_token_hand_over(node_name: str, key: str) -> None:
    from django.conf import settings

    from agents.simulator.tokens import token_hand_over, tokens_path

    token_hand_over(tokens_path(settings.DATA_DIR), node_name=node_name, key=key)


def _notify(node_name: str) -> None:
    from agents.events import node_changed

    transaction.on_commit(lambda: node_changed(node_name))


def _cards_of(gpus: Collection[Mapping[str, Any]]) -> list[tuple[int, str, str]]:
    """What makes a node's inventory its own: each card's index, UUID and model (limits change with capping)."""
    return sorted((g["index"], g.get("uuid") or "", g.get("name") or "") for g in gpus)


def _known_gpus(node: Node) -> list[dict[str, Any]]:
    """The node's accepted cards, as a heartbeat's inventory lists them."""
    return [
        {
            "index": g.index, "uuid": g.uuid, "name": g.model, "memory_gib": g.memory_gib,
            "power_limit_watts": g.power_limit_watts, "power_limit_max_watts": g.power_limit_max_watts,
        }
        for g in node.gpus.filter(present=True).order_by("index")
    ]


def _inventory_pending(node: Node, reported: list[Mapping[str, Any]] | None, now) -> None:
    """Set (or clear, None) the change of cards waiting for an operator on the node (not saved here)."""
    reported = None if reported is None else [dict(g) for g in reported]
    if reported == node.pending_inventory:
        return
    if reported is None:
        node.inventory_pending_since = None
    else:
        # Logged once per change, not at every heartbeat: the node's page, its API and /metrics show it.
        log.warning(
            "node %s reports %d GPUs where %d are known: the change waits for an operator "
            "(llmgw ctl nodes accept-inventory %s)", node.name, len(reported), len(_known_gpus(node)), node.name,
        )
        node.inventory_pending_since = node.inventory_pending_since or now
    node.pending_inventory = reported


def inventory_pending(node: Node) -> dict[str, Any] | None:
    """The change of cards waiting for an operator on a node, as its page and API show it: the cards its
    agent reports, since when, how many are known, and a line per card that differs; None: none waits."""
    if node.pending_inventory is None:
        return None
    known = {g["index"]: g for g in _known_gpus(node)}
    reported = {g["index"]: g for g in node.pending_inventory}

    def card(g: Mapping[str, Any]) -> str:
        return " ".join(part for part in (g.get("name") or "", f"({g['uuid']})" if g.get("uuid") else "") if part) or "a card"

    changes = []
    for index in sorted(set(known) | set(reported)):
        was, now = known.get(index), reported.get(index)
        if was is None:
            changes.append(f"GPU {index}: new, {card(now)}")
        elif now is None:
            changes.append(f"GPU {index}: gone, was {card(was)}")
        elif _cards_of([was]) != _cards_of([now]):
            changes.append(f"GPU {index}: {card(was)} is now {card(now)}")
    return {"gpus": node.pending_inventory, "since": node.inventory_pending_since, "known": len(known), "changes": changes}


def implausible_lines(sensors: Mapping[str, Any]) -> list[str]:
    """The readings the node's last heartbeat had dropped, a line each (as the heartbeat's answer warned)."""
    from agents.node.protocol import implausible_text

    return [
        implausible_text(entry) if isinstance(entry, Mapping) else str(entry)
        for entry in sensors.get("implausible") or ()
    ]


def node_facts(node_name: str, heartbeat: Mapping[str, Any]) -> tuple[float | None, list[dict] | None]:
    """What the control plane knows of a node that judges its heartbeat's readings (agents.readings'
    facts): its max_draw_watts, and its accepted cards where the heartbeat's differ and are not taken as
    they are (None: the heartbeat's own). A node not known yet: (None, None)."""
    node = Node.objects.filter(name=node_name).only("id", "max_draw_watts", "last_heartbeat_at", "inventory_open").first()
    if node is None:
        return None, None
    if node.last_heartbeat_at is None or node.inventory_open:
        return node.max_draw_watts, None
    known = _known_gpus(node)
    reported = (heartbeat.get("inventory") or {}).get("gpus")
    if reported is not None and _cards_of(reported) == _cards_of(known):
        return node.max_draw_watts, None
    return node.max_draw_watts, known


def _forget_report(node: Node) -> None:
    """Every process's next heartbeat of the node takes the full path (which reads its facts again): the
    batch writes find its stored report changed (not saved here)."""
    from agents import readings

    node.report_digest = ""
    # Now (this process's next heartbeat of it reads the row, which waits on this change's lock) and once
    # committed (a full path between the two remembered the report this change replaces).
    readings.forget(node.name)
    transaction.on_commit(lambda: readings.forget(node.name))


@transaction.atomic
def node_inventory_accept(*, node_name: str) -> Node:
    """Take the change of cards a node's heartbeats report as its inventory: placement and its readings
    count them from now on. Conflict when no change waits (the node's state, not the request, is at odds)."""
    node = rows_locked(Node.objects.filter(name=node_name)).first()
    if node is None:
        raise NotFound(f"node {value_shown(node_name)} is not known", field="node")
    if node.pending_inventory is None:
        raise Conflict(f"node {node_name}: no change of its GPUs waits to be accepted", field="node")
    _record_gpus(node, node.pending_inventory)
    log.info("node %s: its inventory of %d GPUs is accepted", node.name, len(node.pending_inventory))
    node.pending_inventory = None
    node.inventory_pending_since = None
    _forget_report(node)
    node.save(update_fields=["pending_inventory", "inventory_pending_since", "report_digest"])
    _nodes_changed(node.name)
    _notify(node.name)
    return node


# A node's ceiling: no node draws more than a hall's feed; a figure past it is a unit error.
MAX_DRAW_WATTS_MAX = 200_000


@transaction.atomic
def node_max_draw_set(*, node_name: str, watts: float | None) -> Node:
    """Set (None: clear) the most a node can draw (its PSUs' rating, a DCIM's maximum draw): a reading of
    the node above it is dropped as implausible."""
    if watts is not None and (
        isinstance(watts, bool) or not isinstance(watts, int | float) or not 0 < watts <= MAX_DRAW_WATTS_MAX
    ):
        raise InvalidInput(
            f"max_draw_watts: must be a number of watts above 0 and at most {MAX_DRAW_WATTS_MAX:,}, not "
            f"{value_shown(watts)}", field="max_draw_watts",
        )
    node = rows_locked(Node.objects.filter(name=node_name)).first()
    if node is None:
        raise NotFound(f"node {value_shown(node_name)} is not known", field="node")
    node.max_draw_watts = None if watts is None else float(watts)
    _forget_report(node)
    node.save(update_fields=["max_draw_watts", "report_digest"])
    _notify(node.name)
    return node


def measured_watts(sensors: Mapping[str, Any], *, node_watts: float | None = None) -> float | None:
    """What a node's sensors say it draws beyond ``node_watts`` (the facility's figure of a node's own part):
    its GPUs plus its CPU packages; None when nothing was read.

    With its BMC's figure (``power_source: "bmc"``, the whole chassis) it is that figure less ``node_watts``,
    never below 0: a node's term in a domain's use, ``node_watts + max(placed, measured)``
    (facility.power.node_use_watts), is then ``max(node_watts + placed, the BMC's figure)`` — the BMC's
    reading takes the place of GPU + CPU + node_watts.
    """
    if sensors.get("power_source") == "bmc" and sensors.get("node_power_watts") is not None:
        return max(0.0, float(sensors["node_power_watts"]) - (node_watts or 0.0))
    values = [g["power_watts"] for g in sensors.get("gpus", []) if g.get("power_watts") is not None]
    if sensors.get("cpu_power_watts") is not None:
        values.append(sensors["cpu_power_watts"])
    return float(sum(values)) if values else None


class NodeWattsUnknown(Exception):
    """On the event loop, the facility's node_watts is not at hand, and the BMC's figure needs it."""


def node_measured_watts(sensors: Mapping[str, Any], *, on_event_loop: bool = False) -> float | None:
    """:func:`measured_watts` of a heartbeat's sensors, with the facility's node_watts where the BMC's figure
    needs it (agents.readings.assumed_draws); NodeWattsUnknown on the event loop when it is not at hand."""
    node_watts = None
    if sensors.get("power_source") == "bmc":
        from agents import readings

        draws = readings.assumed_draws(on_event_loop=on_event_loop)
        if draws is None:
            raise NodeWattsUnknown
        node_watts = draws[1]
    return measured_watts(sensors, node_watts=node_watts)


def power_source(sensors: Mapping[str, Any]) -> dict[str, Any]:
    """Where a node's measured draw comes from (``bmc``: its BMC's whole-chassis figure; ``gpu+cpu``: its
    cards' and CPUs' readings; None: nothing read), its BMC's state as a source and the BMC's figure (W)."""
    if sensors.get("power_source") == "bmc" and sensors.get("node_power_watts") is not None:
        source = "bmc"
    elif measured_watts(sensors) is not None:
        source = "gpu+cpu"
    else:
        source = None
    return {
        "power_source": source,
        "bmc_watts": sensors.get("node_power_watts") if source == "bmc" else None,
        "bmc": sensors.get("bmc") or None,
    }


def report_digest(heartbeat: Mapping[str, Any]) -> str:
    """A fingerprint of all a heartbeat says except its sensors: inventory, labels, interval, replica states."""
    parts = {k: heartbeat.get(k) for k in ("inventory", "labels", "agent_version", "interval_seconds", "replicas")}
    return hashlib.blake2b(json.dumps(parts, sort_keys=True).encode(), digest_size=16).hexdigest()


def heartbeat_record(
    *, node_name: str, heartbeat: Mapping[str, Any], now=None, digest: str | None = None
) -> Node | None:
    """Store what an agent reports (already validated): inventory, labels, sensors, replica states.

    A ready node whose heartbeat says the same as its last one, but for the sensors, is one UPDATE
    (returns None); anything new takes the full path in one transaction (returns the node). ``digest``:
    :func:`report_digest` of the heartbeat, where the caller has it.
    """
    from agents import readings

    now = now or timezone.now()
    digest = digest or report_digest(heartbeat)
    sensors = heartbeat.get("sensors") or {}
    interval = heartbeat.get("interval_seconds") or 10
    watts = node_measured_watts(sensors)
    if readings.buffer_readings(node_name, digest, at=now, sensors=sensors, watts=watts, interval=interval):
        return None
    node = _heartbeat_record_full(node_name=node_name, heartbeat=heartbeat, digest=digest, now=now, watts=watts)
    readings.remember(node_name, digest)  # a rolled-back outer transaction heals: the batch write forgets it
    return node


@transaction.atomic
def _heartbeat_record_full(
    *, node_name: str, heartbeat: Mapping[str, Any], digest: str, now, watts: float | None
) -> Node:
    inventory = heartbeat.get("inventory") or {}
    sensors = heartbeat.get("sensors") or {}
    agent = dict(heartbeat.get("labels") or {})
    joining = _domains_joining(node_name, agent=agent)
    created = False

    def lock() -> tuple[Node, bool]:
        nonlocal created
        node, created = rows_locked(Node.objects.all()).get_or_create(name=node_name)
        return node, not created and agent != (node.agent_labels or {})

    node = _node_locked(lock, joining, agent=agent)
    was_ready = node.is_ready(now)
    # A node never heard from, or re-registered (a new token), is taken at its word; any other change of
    # its cards waits for an operator.
    takes_inventory = created or node.last_heartbeat_at is None or node.inventory_open
    node.hostname = inventory.get("hostname", node.hostname) or ""
    node.fabric = inventory.get("fabric") or ""
    node.cpu_cores = inventory.get("cpu_cores", node.cpu_cores) or 0
    node.memory_gib = inventory.get("memory_gib", node.memory_gib) or 0
    topology_changed = _record_topology(node, inventory)
    node.agent_version = heartbeat.get("agent_version", "") or ""
    node.heartbeat_interval_seconds = heartbeat.get("interval_seconds") or node.heartbeat_interval_seconds
    node.last_heartbeat_at = now
    node.sensors = dict(sensors)
    node.sensors_at = now
    node.measured_watts = watts
    node.measured_peaks, node.measured_peak_watts = measured_peak_of(node.measured_peaks, node.measured_watts, now)
    node.report_digest = digest
    labels_changed = created or (heartbeat.get("labels") or {}) != node.agent_labels
    node.agent_labels = dict(heartbeat.get("labels") or {})
    inventory_changed = False
    if "gpus" in inventory:  # absent: its GPUs were not read this time (NVML past its deadline)
        reported = inventory["gpus"]
        if takes_inventory or _cards_of(reported) == _cards_of(_known_gpus(node)):
            _inventory_pending(node, None, now)
            node.inventory_open = False
            inventory_changed = _record_gpus(node, reported)
        else:
            _inventory_pending(node, reported, now)
    node.save()
    inventory_changed = inventory_changed or topology_changed
    domains_moved = node_refresh_labels(node) if labels_changed else False
    signals.node_reported.send(sender=Node, node=node, states=heartbeat.get("replicas") or [], now=now)
    if created or not was_ready or labels_changed or inventory_changed:
        _nodes_changed(node.name, heartbeat=True, domains_moved=domains_moved)
    _notify(node.name)
    return node


def _record_topology(node: Node, inventory: Mapping[str, Any]) -> bool:
    """Take the inventory's GPU topology onto the node (not saved here); True if it changed.

    A heartbeat whose GPUs were not read (NVML past its deadline: no ``gpus``) keeps the one known; GPUs
    read without a topology (an older agent, or none could be read) clear it."""
    if "gpu_topology" in inventory:
        topology = dict(inventory["gpu_topology"])
    elif "gpus" in inventory:
        topology = {}
    else:
        return False
    if topology == (node.gpu_topology or {}):
        return False
    node.gpu_topology = topology
    return True


def _record_gpus(node: Node, gpus: list[Mapping[str, Any]]) -> bool:
    """Upsert the node's GPUs by index; a GPU no longer reported is kept, marked absent. True if changed."""
    existing = {g.index: g for g in node.gpus.all()}
    seen = set()
    changed = False
    for item in gpus:
        index = item["index"]
        seen.add(index)
        fields = {
            "uuid": item.get("uuid", ""),
            "model": item.get("name", ""),
            "memory_gib": item.get("memory_gib"),
            "power_limit_watts": item.get("power_limit_watts"),
            "power_limit_max_watts": item.get("power_limit_max_watts"),
            "present": True,
        }
        gpu = existing.get(index)
        if gpu is None:
            GPU.objects.create(node=node, index=index, **fields)
            changed = True
        elif any(getattr(gpu, k) != v for k, v in fields.items()):
            for k, v in fields.items():
                setattr(gpu, k, v)
            gpu.save(update_fields=list(fields))
            changed = True
    gone = [g.pk for i, g in existing.items() if i not in seen and g.present]
    if gone:
        GPU.objects.filter(pk__in=gone).update(present=False)
        changed = True
    return changed
