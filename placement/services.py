"""Writes of placement: models (apply, delete), freeing a replica's shards, and the operator's actions.

The operator's actions are one use case each, with the warnings (and, for a hold, the preview) a person
confirms: hold and release a domain, change a node's labels, set and remove a budget, cordon, uncordon
and drain a node. Every interface (ctl, API, console, admin, the reconcile) calls these, so the four
say the same warnings for the same change. Parsing of model documents is
in :mod:`placement.documents`, the guarded commit in :mod:`placement.commit`, the reconcile in
:mod:`placement.reconcile`, what agents report in :mod:`placement.reports`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import OperationalError, connection, transaction
from django.db.models import Sum

from agents.models import Node
from agents.node.protocol import value_shown
from llmgw.errors import InvalidInput, NotFound, is_write_conflict
from llmgw.lock_order import rows_locked
from llmgw.sqlin import any_of, sql_in
from llmgw.yamldoc import read_text
from placement import documents
from placement.models import GpuBooking, Model, NodeBooking, Replica, Shard
from placement.signals import placement_changed_on_commit, reconcile_request


@dataclass
class Applied:
    """What applying one model document did: ``created``, ``updated`` or ``unchanged``; ``warning``: what
    the change leaves as it was (placed replicas keep the profile they were placed with)."""

    name: str
    action: str
    warning: str | None = None


# What a placed replica was placed and booked with: changed, it keeps the old until it is placed anew. (A
# keep_within set since moves a replica that spans its domains: placement.drain.) Its command is not kept:
# the agents run what the model says now, so a new one restarts every placed replica.
PLACED_WITH = ("gpus", "nodes", "cpu_cores", "memory_gib", "power_watts", "topology", "node_selector")


# pg_advisory_xact_lock key of a models apply: one at a time counts every model's replicas and writes.
MODELS_APPLY_LOCK = 0x6C6C6D6D  # "llmm"


def _totals_check(values: list[dict[str, Any]]) -> None:
    """Refuse a change that would take the models past documents.MAX_MODELS, or every model's replicas
    together past documents.MAX_REPLICAS_TOTAL, naming the model that asks the most.

    On PostgreSQL the applies take turns from here to their commit: two at once would each count the
    other's models as they were before and could together go past the bound. (SQLite's writers take
    turns already.)"""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [MODELS_APPLY_LOCK])
    asked = {v["name"]: v["replicas"] for v in values}
    known = Model.objects.count()
    new = len(asked) - Model.objects.filter(name__in=list(asked)).count()
    if known + new > documents.MAX_MODELS:
        raise InvalidInput(
            f"name: at most {documents.MAX_MODELS:,} models; this adds {new:,} where {known:,} are known "
            "(delete the ones no longer served: llmgw ctl delete model NAME)",
            field="name",
        )
    others = Model.objects.exclude(name__in=list(asked)).aggregate(total=Sum("replicas"))["total"] or 0
    total = others + sum(asked.values())
    if total <= documents.MAX_REPLICAS_TOTAL:
        return
    largest = max(asked, key=lambda name: asked[name])
    raise InvalidInput(
        f"replicas: every model's replicas together at most {documents.MAX_REPLICAS_TOTAL:,}; this asks "
        f"{sum(asked.values()):,} ({value_shown(largest)}: {asked[largest]:,}) where the other models hold "
        f"{others:,}",
        field="replicas",
    )


def _models_save(documents: list[dict[str, Any]]) -> list[Applied]:
    _totals_check(documents)
    results = []
    for values in documents:
        name = values["name"]
        fields = {k: v for k, v in values.items() if k != "name"}
        model = rows_locked(Model.objects.filter(name=name)).first()
        if model is None:
            Model.objects.create(name=name, **fields)
            results.append(Applied(name, "created"))
            continue
        changed = [k for k, v in fields.items() if getattr(model, k) != v]
        if changed:
            for key in changed:
                setattr(model, key, fields[key])
            model.save(update_fields=[*changed, "updated_at"])
        results.append(Applied(name, "updated" if changed else "unchanged", _kept_warning(model, changed)))
    _request_reconcile()
    return results


def _kept_warning(model: Model, changed: list[str]) -> str | None:
    """What a change does not do, or does at once, to the model's placed replicas: ``profile.power_watts
    changed: its 3 placed replicas keep …``; ``profile.command changed: its 3 placed replicas restart …``."""
    kept = [f"profile.{key}" for key in PLACED_WITH if key in changed]
    if not kept and "command" not in changed:
        return None
    placed = Replica.objects.filter(model=model, shards__isnull=False).distinct().count()
    if not placed:
        return None
    them = f"its {placed} placed replica{'s' if placed != 1 else ''}"
    warnings = []
    if kept:
        warnings.append(
            f"{', '.join(kept)} changed: {them} {'keep what they were' if placed != 1 else 'keeps what it was'} "
            "placed with (GPUs, cores, memory, booked power); replicas placed from now on take the new profile"
        )
    if "command" in changed:
        warnings.append(
            f"profile.command changed: {them} {'restart' if placed != 1 else 'restarts'} with it at "
            f"{'their nodes' if placed != 1 else 'its node'}' next heartbeat, all at once"
        )
    return "; ".join(warnings)


@transaction.atomic
def models_apply(*, text: str, filename: str = "models.yaml") -> list[Applied]:
    """Create or update the models of a multi-document YAML file: all of them, or none with the reason.

    A changed profile applies to replicas placed from now on; placed ones keep their shards, but for one
    whose nodes span more than one domain of a keep_within set since: it moves, replacement first
    (placement.drain).
    """
    return _models_save(documents.models_parse(text=text, filename=filename))


def models_apply_file(*, path: str | Path) -> list[Applied]:
    """``llmgw ctl apply -f models.yaml``."""
    return models_apply(text=read_text(path), filename=str(path))


@transaction.atomic
def model_apply(*, data: Any) -> Applied:
    """Create or update one model from a document given as data (the API's JSON body)."""
    return _models_save([documents.model_parse(data=data)])[0]


@transaction.atomic
def model_delete(*, name: str) -> int:
    """Delete a model: its replicas' shards are freed first (GPUs, cores, memory, placed watts).

    Returns how many replicas went with it.
    """
    model = rows_locked(Model.objects.filter(name=name)).first()
    if model is None:
        raise NotFound(f"model {value_shown(name)} is not known", field="name")
    freed = replicas_free(replica_ids=Replica.objects.filter(model=model).values_list("pk", flat=True))
    model.delete()
    _request_reconcile()
    return freed


def _request_reconcile() -> None:
    reconcile_request()
    placement_changed_on_commit()


# -- freeing ----------------------------------------------------------------------------------------------


def replica_free(*, replica: Replica) -> bool:
    """Remove one replica and give back what its shards booked (:func:`replicas_free`); False if already gone."""
    return replicas_free(replica_ids=[replica.pk]) == 1


# A freeing that finds a node it did not lock first (a replica placed between its two reads) tries again
# this many times, the first locks given back in between.
FREE_ATTEMPTS = 5


@transaction.atomic
def replicas_free(*, replica_ids: Iterable[int]) -> int:
    """Remove replicas and give back what their shards booked, in one transaction; how many were still there.

    Set-based, whatever their number: the nodes of all their shards are locked at once, by name (the
    one order every writer that locks nodes keeps: placements, holds, freeing), so freeing several
    replicas never deadlocks with a hold or a placement; then the replica rows, then a few statements
    delete bookings, shards and replicas and recount the nodes' booking rows. Safe to call twice at
    once (two reconciles finishing one drain): the second finds the rows gone and gives back nothing.
    """
    ids = sorted(set(replica_ids))
    if not ids:
        return 0
    for attempt in range(FREE_ATTEMPTS):
        try:
            # A savepoint: when it rolls back, the row locks taken in it are given back too.
            with transaction.atomic():
                return _replicas_free_locked(ids)
        except OperationalError as exc:
            if not is_write_conflict(exc) or attempt == FREE_ATTEMPTS - 1:
                raise
            time.sleep(0.02 * (attempt + 1))
    return 0  # not reached


def _replicas_free_locked(ids: list[int]) -> int:
    # Thousands of ids (a model scaled down) go as one array (llmgw.sqlin), and the shards' node ids
    # unordered: Shard's default ordering would make DISTINCT one row a shard.
    shards = Shard.objects.filter(replica_id__in=any_of(ids)).order_by()
    locked = set(nodes_lock(shards.values_list("node_id", flat=True).distinct()))
    present = list(
        rows_locked(Replica.objects.filter(pk__in=any_of(ids))).values_list("pk", flat=True)
    )
    if not present:
        return 0  # freed meanwhile
    node_ids = set(
        Shard.objects.filter(replica_id__in=any_of(present)).order_by().values_list("node_id", flat=True).distinct()
    )
    # Placed between the two reads (the replica's lock waited for that commit). Its placer may go on to
    # place another replica of the model on the same node, holding that node and waiting for a replica
    # row locked here: so these nodes are not waited for. Busy, the whole freeing gives its locks back
    # and starts again.
    nodes_lock(node_ids - locked, nowait=True)
    GpuBooking.objects.filter(shard__replica_id__in=any_of(present)).delete()
    with connection.cursor() as cursor:
        where, params = sql_in("replica_id", present)
        cursor.execute(f"DELETE FROM {Shard._meta.db_table} WHERE {where}", params)
        bookings_recount(cursor, sorted(node_ids))
        where, params = sql_in("replaces_id", present)
        cursor.execute(f"UPDATE {Replica._meta.db_table} SET replaces_id = NULL WHERE {where}", params)
        where, params = sql_in("id", present)
        cursor.execute(f"DELETE FROM {Replica._meta.db_table} WHERE {where}", params)
    placement_changed_on_commit()
    return len(present)


def bookings_recount(cursor, node_ids: list[int]) -> None:
    """Set locked nodes' booking rows to the sums of the shards they still have (one statement)."""
    if not node_ids:
        return
    shard, booking = Shard._meta.db_table, NodeBooking._meta.db_table

    def total(column: str) -> str:
        return f"COALESCE((SELECT SUM({column}) FROM {shard} s WHERE s.node_id = {booking}.node_id), 0)"

    where, params = sql_in("node_id", node_ids)
    cursor.execute(
        f"UPDATE {booking} SET cpu_cores = {total('s.cpu_cores')}, memory_gib = {total('s.memory_gib')}, "
        f"placed_watts = {total('COALESCE(s.draw_watts, 0)')} WHERE {where}",
        params,
    )


def nodes_lock(node_ids: Iterable[int], *, nowait: bool = False) -> list[int]:
    """Lock the nodes by name (the order every placement locks them in); their ids. ``nowait``: a node
    another transaction holds raises a write conflict at once rather than waiting."""
    ids = sorted(set(node_ids))
    if not ids:
        return []
    rows = rows_locked(Node.objects.filter(pk__in=any_of(ids)), nowait=nowait)
    return list(rows.values_list("id", flat=True))


# -- holds: the one flow every interface takes (Facility page, node menu, API, ctl, admin) ----------------


@dataclass(frozen=True)
class HoldPreview:
    """Holding a domain, before anything is written: the warnings a person confirms and the dry run.

    ``what_if`` is :func:`placement.whatif.what_if`'s result, its refusals quoting the operator's reason;
    ``changes`` are the dry run's domains (those whose use the hold and drain would change, and those past
    their limit after), as a person reads them (``rack:r1-02``, ``3.4 kW``, ``9.2 kW``, ``14.4 kW``, over or not).
    """

    domain: str
    reason: str
    drain: bool
    warnings: list[str]
    what_if: dict[str, Any]
    held_already: bool

    @property
    def changes(self) -> list[dict[str, Any]]:
        from facility.power import kw

        return [
            {
                "domain": d["domain"],
                "before": kw(d["use_watts_before"]),
                "after": kw(d["use_watts_after"]),
                "limit": kw(d["limit_watts"]),
                "over": d["use_watts_after"] > d["limit_watts"],
            }
            for d in self.what_if["domains"]
        ]

    def as_dict(self) -> dict[str, Any]:
        return {
            "domain": self.domain, "reason": self.reason, "drain": self.drain, "warnings": self.warnings,
            "held_already": self.held_already, "what_if": self.what_if,
        }


@dataclass(frozen=True)
class HoldCreated:
    """A hold written, with the warnings its preview gave (the API's ``warning``, what ctl prints)."""

    hold: Any
    warnings: list[str]


def hold_preview(*, domain: Any, reason: Any, drain: bool | None = None, new: bool | None = None) -> HoldPreview:
    """What holding `domain` for `reason` would do: the dry run (which replicas would move where, which are
    blocked, each domain's use before and after) and the warnings to confirm (a name no node is in; with
    drain, a domain it would take past its limit, a replica that cannot move). Nothing is written.

    Bad input raises InvalidInput naming the field, as :func:`hold_create` would. ``drain`` None: as the
    domain's hold has it (no drain for a domain not held).
    """
    from facility import services as facility_services
    from facility.models import Hold
    from placement import whatif

    if new is not None and not isinstance(new, bool):
        raise InvalidInput("new: must be true or false", field="new")
    # A bare name resolved; a domain nothing knows refused unless new (the API's and ctl's), or None where
    # the interface confirms the warning itself (the console's "Hold anyway"): facility.services.hold_domain.
    domain = facility_services.hold_domain(domain, new=new)
    values = facility_services.hold_check(domain=domain, reason=reason)
    existing = Hold.objects.filter(domain=values["domain"]).values_list("drain", flat=True).first()
    if drain is None:
        drain = bool(existing)
    result = whatif.what_if(hold=values["domain"], drain=drain, reason=values["reason"])
    return HoldPreview(values["domain"], values["reason"], drain, result["warnings"], result, existing is not None)


def hold_create(
    *, domain: Any, reason: Any, drain: bool | None = None, created_by: str = "", new: bool | None = None
) -> HoldCreated:
    """Hold a domain (nothing new placed in it; ``drain``: its replicas move out), after the same preview
    every interface shows: the hold and the preview's warnings. The console asks for a confirmation of
    those warnings before calling this; the API and ctl say them with the answer."""
    from facility import services as facility_services
    from facility.models import Hold

    preview = hold_preview(domain=domain, reason=reason, drain=drain, new=new)
    before = Hold.objects.filter(domain=preview.domain).values_list("reason", flat=True).first()
    hold = facility_services.hold_create(
        domain=preview.domain, reason=preview.reason, drain=drain, created_by=created_by, new=new
    )
    warnings = list(preview.warnings)
    if before is not None and before != preview.reason:  # one hold a domain: the new reason replaces the old
        warnings.append(f"{preview.domain} was held already ({before}): its reason is now {preview.reason}")
    return HoldCreated(hold, warnings)


def release_preview(*, domain: Any) -> str:
    """What releasing a hold puts back in play, for the confirmation (``new replicas may be placed on rack
    r1-01's 4 nodes (…) again``); NotFound when the domain is not held."""
    from facility import services as facility_services

    domain = facility_services.held_domain(domain)  # a bare name one hold has; NotFound with names near it
    return facility_services.release_text(domain=domain)


def hold_release(*, domain: Any) -> str:
    """Release a hold (and stop its drain); returns what it put back in play, as :func:`release_preview` said."""
    from facility import services as facility_services

    text = release_preview(domain=domain)
    facility_services.hold_release(domain=domain)
    return text


@dataclass(frozen=True)
class Changed:
    """A change written, with the warnings every interface says beside it (the API's ``warning``, ctl's
    ``warning:`` lines, the console's notes). ``value``: what the change wrote, as its service returns it."""

    value: Any
    warnings: list[str]


def labels_preview(*, node_name: Any, changes: Any) -> list[str]:
    """The warnings of a label change, before it is written: a domain no node is in yet (a typo?), a
    domain the node's draw would take past its limit, a node that has not joined. Bad labels raise
    InvalidInput naming the label, as :func:`labels_change` would. Nothing is written."""
    from agents import services as agents_services
    from facility import services as facility_services

    node_name = agents_services.clean_node_name(node_name)
    agents_services.labels_check(changes=changes)
    return facility_services.location_warnings(node_name=node_name, changes=changes)


def labels_change(*, node_name: Any, changes: Any, set_by: str = "") -> Changed:
    """Set (value) or remove (None) a node's store labels, all or nothing; ``value``: its labels after."""
    from agents import services as agents_services

    warnings = labels_preview(node_name=node_name, changes=changes)
    return Changed(agents_services.labels_set(node_name=node_name, changes=changes, set_by=set_by), warnings)


def _over_limit_warning(domain: str) -> str | None:
    """``rack r1-01 uses 12.0 kW now, above its 10.0 kW limit: …`` when the domain's use is past its limit."""
    from facility import power
    from facility.selectors import domain_figures

    figure = domain_figures(domain=domain)
    if figure.limit_watts is None or not power.would_pass_limit(figure.use_watts, figure.limit_watts):
        return None
    return (
        f"{figure.domain.label} uses {power.kw(figure.use_watts)} now, above its {power.kw(figure.limit_watts)} "
        "limit: nothing new is placed there until its use is below"
    )


def budget_change(*, domain: Any, cap_watts: Any, other_watts: Any = None, source: str | None = None) -> Changed:
    """Create or change a domain's power budget; ``value``: the Budget. Warnings: a domain no node is in
    yet (a typo?), a cap above what the domain's feeds carry (the feeds' cap holds), a use already past
    the new limit."""
    from facility import services as facility_services
    from facility.feed_services import feed_cap_warning
    from facility.models import Source

    values = facility_services.budget_check(domain=domain, cap_watts=cap_watts, other_watts=other_watts)
    typo = facility_services.domain_warning(domain=values["domain"])
    budget = facility_services.budget_set(**values, source=source or Source.API)
    warnings = [typo] if typo else []
    feeds = feed_cap_warning(budget)
    if feeds:
        warnings.append(f"{feeds}; the feed's cap holds")
    over = _over_limit_warning(budget.domain)  # its other equipment alone may pass it
    if over:
        warnings.append(over)
    return Changed(budget, warnings)


def budget_remove(*, domain: Any) -> Changed:
    """Remove a domain's written budget (NotFound when it has none; InvalidInput when its cap is its feeds'
    alone, which no removal changes). A cap its feeds give comes back;
    where none does, the warning says the domain has no power limit any more."""
    from facility import services as facility_services
    from facility.models import Budget
    from facility.power import kw

    domain = facility_services.clean_domain(domain)
    facility_services.budget_delete(domain=domain)
    warnings = []
    derived = Budget.objects.filter(domain=domain).first()
    if derived is None:
        warnings.append(f"{domain.replace(':', ' ', 1)} has no power limit any more: nothing refuses a replica there for power")
    else:
        warnings.append(f"{domain}'s feeds' cap holds: {kw(derived.cap_watts)} from {derived.derived_from}")
    return Changed(None, warnings)


def cordon_preview(*, node_name: Any, drain: bool) -> list[str]:
    """The warnings of cordoning a node with ``drain``, before anything is written: each domain its drain
    would take past its limit and each replica that could not move (the drain waits there), from the
    same dry run as a hold's. Without drain, none: its replicas stay."""
    from agents import services as agents_services
    from placement import whatif

    node_name = agents_services.clean_node_name(node_name)
    if not drain:
        return []
    return whatif.hold_result_warnings(whatif.what_if(node=node_name, drain=True))


def cordon_change(*, node_name: Any, cordoned: bool, reason: Any = "", drain: bool = False) -> Changed:
    """Cordon (nothing new placed; ``drain``: its replicas move out, replacement first) or uncordon a node;
    ``value``: the Node. Warnings: what :func:`cordon_preview` says of a drain, and an uncordon that stops
    a drain (the replicas moved so far stay where they are)."""
    from agents import services as agents_services

    node_name = agents_services.clean_node_name(node_name)
    was = Node.objects.filter(name=node_name).values_list("cordoned", "draining").first()
    if was is None:
        raise NotFound(f"node {value_shown(node_name)} is not known", field="node")
    starts_drain = cordoned and drain and not was[1]
    warnings = cordon_preview(node_name=node_name, drain=True) if starts_drain else []
    node = agents_services.node_cordon(node_name=node_name, cordoned=cordoned, reason=reason or "", drain=drain)
    if not cordoned and was[1] and Shard.objects.filter(node=node).exists():  # a drain done stops nothing
        warnings.append(f"{node.name}'s drain stops: the replicas moved so far stay where they are")
    return Changed(node, warnings)
