"""An in-memory index of node state, kept between placements, for planning fast.

Kept whole: its slates, heaps and rankings move together on every change of a node, and each invariant
(a heap's key a lower bound, a slate's range of use) is kept by code that touches all three; split, the
invariants would live across modules. Its property tests compare it with the plain path as one unit.

:func:`placement.planner.plan_replica` checks every node on every call: simple, and the reference.
A reconcile run places many replicas in a row, so this index keeps what the plain path recomputes:

- nodes grouped by location (their tuple of domains), each group's nodes bucketed by free GPUs and by
  replicas, with the group's condition verdict (refusal, rank, notes) worked out once;
- each budgeted domain's use, updated by the change of one node's term when its view changes;
- for each shard shape planned (the cards a shard asks and how its draw is counted: :class:`_Shape`),
  the candidates in order, shared by every model of that shape: in slates (:class:`_Slate`) of nodes
  alike for any model of the shape — one group's nodes of one GPU model holding the same weights of the
  shape's models (a node holding only other models' weights is alike for them all) — each in the
  order of what is left of the key once the model's spread, rank, efficiency and weights are fixed
  (headroom step, bin packing, name), each entry with the range of its rack's use within which its
  step holds;
- for each model and profile planned (:class:`_Ranking`), a heap of its shape's slates by their first
  key for that model (a lower bound of it, made exact when it comes to the top), and the model's
  spread counts.

Only what could have moved is worked out again, and only when a plan gets to it. A node's change (a
placement, a heartbeat, a lost race) moves that node's entry in each shape's slate, once for every
model of the shape. A rack's use that rose leaves its slates' first keys later, so where they sit in the
heaps stays a lower bound: a slate is stepped again when it comes to the top of a heap (the entries
whose range the use left), for every model at once. A use that fell below a slate's range steps it
again at once, and a slate whose first key came earlier is logged for the rankings to move it up in
their heaps. Readings fold into headroom steps: a measured draw that drifts within a step moves no
candidate. The model's new replica raises the spread of the groups in its rack and PDU, again only a
later key.

:meth:`PlacementIndex.plan` merges the slates' orders from the heap and stops at the first candidate
that passes every filter. The candidates it passed over are kept with their reasons (:class:`_Walk`),
and the slates it walked through stay off the heap: the next plan starts where this one stopped while
none of them moved, no candidate came in ahead of the last one passed over, their budgeted domains' use
did not change and the exclusions are the same (a lost room's held nodes and the full racks were walked
again by each of its replacements). What moved since is read off two logs — the slates whose order
changed, the budgeted domains whose use changed — not asked of each slate walked; a walk some of whose
slates moved is replayed, its other places passed over in bulk. It gives the same plan as
``plan_replica`` (property tests hold the two together, through heartbeats, drifting readings, label moves
and new facility figures): the same filters and keys, shared with the planner module, and the same kept
rejections (candidates ranked ahead of the chosen one, in rank order). A no-fit reports every node, as the
plain path words it; a multi-node replica goes through ``plan_replica`` on the indexed views.

The rules come from the registry (placement.plugins.REGISTRY). The built-in scorers are the index's own
(spread, condition, headroom step, tokens per joule, weights, bin packing: the places of its keys); of
the built-in filters it asks a candidate only those whose ``asks`` says they can turn such a node down for
the profile (ready, cordoned, held and the free cards are its candidates' own). A rule not built in that
says what it reads of a node is kept: a filter's first refusal by node, model and profile; a scorer's key
likewise, its slates telling the keys apart (a shape is then one model's and profile's) and the key put in
the scorer's place among the index's own (:func:`_scorers_laid_out`); each worked out again when a field it
reads moves. A rule that does not say, or one failing now, sends the plan the plain way.

Kept in one module: its structures (groups, slates, rankings, walks) keep invariants across one
another (a slate's version, its group's spread, a ranking's walk and the slates it passed over) and
change together on every apply and every reading; apart, each would reach into the others' state.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from heapq import heapify, heappop, heappush, heapreplace
from itertools import compress
from operator import itemgetter, not_

from facility.domains import Domain
from facility.power import (
    EPSILON_WATTS,
    Budget,
    kw,
    limit_text,
    node_use_added_watts,
    node_use_watts,
    power_refusal_at,
    would_pass_limit,
)
from placement.planner import (
    FULL_HEADROOM,
    HEADROOM_STEPS,
    SPREAD_LEVELS,
    FacilityView,
    NodeView,
    NoFit,
    Placing,
    Plan,
    Profile,
    ReplicaRequest,
    ShardPlan,
    added_of,
    apply_shard,
    blocked_reason,
    candidate_filters,
    condition_verdict,
    draw_of,
    efficiency_of,
    filter_inputs,
    nofit_summary,
    plan_replica,
    rule_inputs,
    shard_for,
    spread_counts,
    spread_of,
    unavailable_reason,
)
from placement.plugins import REGISTRY

log = logging.getLogger(__name__)

# Rankings kept (one per model and profile, the least recently planned dropped first, and with the last
# of a shape its shape), and the improvements a shape keeps logged for its rankings to catch up on (a
# ranking further behind is made afresh).
_RANKINGS_KEPT = 64
_IMPROVEMENTS_KEPT = 65536
# Changes each log keeps for the kept walks to read (a walk made before what it still holds is walked
# again whole).
_CHANGES_KEPT = 65536
_INFINITY = float("inf")
# A kept step is trusted while the rack's use stays this share of the limit away from where the step
# would change: the boundaries are worked out in floating point, step_left decides the rest.
_STEP_SLACK = 1e-9


def _stepped(limit: float, use: float, added: float) -> tuple[int, float, float]:
    """step_left's step for a shard adding ``added`` at the rack's ``use`` (the same arithmetic), and the
    range of the use, exclusive both ends, within which it holds: its boundaries drawn in by _STEP_SLACK of
    the limit. One call, not two: a repair steps most of a slate's entries again."""
    if limit <= 0:
        return 0, -_INFINITY, _INFINITY
    step = math.floor((limit - use - added) * HEADROOM_STEPS / limit + 1e-9)
    slack = limit * _STEP_SLACK
    # step_left is at least t while use <= limit - added - (t - 1e-9) * limit / HEADROOM_STEPS.
    if step >= HEADROOM_STEPS:
        step, low = HEADROOM_STEPS, -_INFINITY
    else:
        if step < 0:
            step = 0
        low = limit - added - (step + 1 - 1e-9) * limit / HEADROOM_STEPS + slack
    high = _INFINITY if step <= 0 else limit - added - (step - 1e-9) * limit / HEADROOM_STEPS - slack
    return step, low, high


class _Log:
    """What changed, in order (slates whose version moved, cells whose use moved), for a kept walk to read
    what moved since it was made instead of asking each of its slates; the oldest dropped past a bound."""

    __slots__ = ("items", "start")

    def __init__(self) -> None:
        self.items: list = []
        self.start = 0  # the position of items[0] since the log began

    def add(self, item: object) -> None:
        self.items.append(item)
        if len(self.items) > _CHANGES_KEPT:
            drop = len(self.items) - _CHANGES_KEPT // 2
            del self.items[:drop]
            self.start += drop

    def mark(self) -> int:
        """Where the log stands now."""
        return self.start + len(self.items)

    def since(self, mark: int) -> list | None:
        """What was added since ``mark``; None when some of it was dropped."""
        return None if mark < self.start else self.items[mark - self.start :]


class _Cell:
    """A budgeted domain, its use, and its refusals and headroom steps at that use (kept until the use
    changes).

    ``use`` is a running sum, kept by each member's change: the steps and the check that a shard passes
    the limit read it (their epsilons are far above its rounding). A refusal's words read the use summed
    exactly from ``terms`` (each member's), as planner.domain_uses sums it: its 0.1 kW are the plain
    path's to the last bit.
    """

    __slots__ = (
        "budget", "margin", "limit", "ceiling", "limit_words", "use", "terms", "_exact", "_head", "_refusals", "_steps",
        "version", "log", "groups",
    )

    def __init__(self, budget: Budget, margin: float, log: _Log) -> None:
        self.budget = budget
        self.margin = margin
        self.limit = budget.limit_watts(margin)
        self.ceiling = self.limit + EPSILON_WATTS  # a use past it may refuse (would_pass_limit)
        self.limit_words = limit_text(budget, margin)
        self._head: str | None = None  # a refusal's words up to "in use", at the exact use
        self.use = budget.other_watts
        self.terms: dict[str, float] = {}
        self._exact: float | None = None
        self._refusals: dict[tuple[float | None, float], str | None] = {}
        self._steps: dict[float, tuple[int, float, float]] = {}
        # Counts the changes of use: a walk's power refusals hold while it stays.
        self.version = 0
        self.log = log  # the index's: each change of use is added to it
        self.groups: list[_Group] = []  # the groups of nodes in the domain

    def count(self, name: str, term: float | None) -> None:
        """A member's term (None: it left), and the use with it."""
        before = self.terms.pop(name, 0.0)
        if term is not None:
            self.terms[name] = term
        change = (term or 0.0) - before
        if change:
            self.use += change
            self._exact = None
            self._refusals.clear()
            self._steps.clear()
            self.version += 1
            self.log.add(self)

    def refusal(self, draw: float | None, added: float) -> str | None:
        """Why a shard of this draw, adding ``added`` to the use, may not come in; None when it fits
        (power_rejection_in's for this one domain, its words' head kept while the use stays)."""
        key = (draw, added)
        if key in self._refusals:
            return self._refusals[key]
        if self._exact is None:
            self._exact = math.fsum((self.budget.other_watts, *self.terms.values()))
            self._head = None
        use = self._exact
        after = use + added
        reason = None
        if would_pass_limit(after, self.limit):
            head = self._head
            if head is None:
                head = self._head = f"{self.budget.domain.label}: {kw(use)} of a {self.limit_words} in use"
            reason = power_refusal_at(head, use_watts=use, after_watts=after, draw_watts=0.0 + (draw or 0))
        self._refusals[key] = reason
        return reason

    def stepped(self, added: float) -> tuple[int, float, float]:
        """The headroom step a shard adding ``added`` leaves at this (rack's) use, and the range of the use
        within which it holds (kept until the use changes: alike nodes and shapes ask the same)."""
        known = self._steps.get(added)
        if known is None:
            known = self._steps[added] = _stepped(self.limit, self.use, added)
        return known


class _Group:
    """Nodes with the same domains: one rack's (and PDU's) worth, typically."""

    __slots__ = ("domains", "spread", "cells", "step_cell", "by_free", "by_replicas", "rank", "notes")

    def __init__(self, domains: tuple[Domain, ...]) -> None:
        self.domains = domains
        self.spread = tuple(d for d in domains if d.level in SPREAD_LEVELS)
        self.cells: tuple[_Cell, ...] = ()
        self.step_cell: _Cell | None = None  # the rack's: the headroom step reads its use
        self.by_free: dict[int, list[str]] = {}
        self.by_replicas: dict[int, list[str]] = {}
        self.rank = 0
        self.notes: tuple[str, ...] = ()

    def set_cells(self, cells: dict[Domain, _Cell]) -> None:
        """The group's budgeted domains' cells, in level order."""
        self.cells = tuple(cells[d] for d in self.domains if d in cells)
        for cell in self.cells:
            cell.groups.append(self)
        self.step_cell = next((c for c in self.cells if c.budget.domain.level == "rack"), None)

    def set_conditions(self, facility: FacilityView) -> None:
        _, self.rank, self.notes = condition_verdict(self.domains, facility.conditions)


class _Entry:
    """One indexed node: its view, its group, its hold reason under the current facility, what it counts
    for in each of its domains (``term``: node_use_watts), and what a shard of each draw adds to that
    (kept for its view: the shapes of one draw share it)."""

    __slots__ = ("node", "group", "held", "term", "adds", "verdicts")

    def __init__(self, node: NodeView, group: _Group, held: str | None, term: float) -> None:
        self.node = node
        self.group = group
        self.held = held
        self.term = term
        self.adds: dict[float | None, float | None] = {}
        # The first refusal of the filters not built in, by the number of (model, profile) in the index:
        # kept while what they read of the node stays (a failure's words are not kept).
        self.verdicts: dict[int, str | None] = {}


def _insert(buckets: dict[int, list[str]], bucket: int, name: str) -> None:
    insort(buckets.setdefault(bucket, []), name)


def _remove(buckets: dict[int, list[str]], bucket: int, name: str) -> None:
    names = buckets[bucket]
    del names[bisect_left(names, name)]
    if not names:
        del buckets[bucket]


class _NodesOf:
    """The indexed nodes by name, as spread_counts reads them (no copy of the whole map)."""

    __slots__ = ("_entries",)

    def __init__(self, entries: dict[str, _Entry]) -> None:
        self._entries = entries

    def get(self, name: str) -> NodeView | None:
        entry = self._entries.get(name)
        return None if entry is None else entry.node


def _entry_of(base: tuple, cell: _Cell | None) -> tuple:
    """A candidate's entry in its slate at the rack's use of now: ``((-step, pack, name), draw, added,
    step, out, low, high)``, where (``low``, ``high``) is the range of the rack's use within which its
    step holds."""
    tail, draw, added, out = base
    if cell is None or added is None:
        return (-FULL_HEADROOM, *tail), draw, added, FULL_HEADROOM, out, -_INFINITY, _INFINITY
    step, low, high = cell.stepped(added)
    return (-step, *tail), draw, added, step, out, low, high


class _Slate:
    """Candidates alike for any model of a shape — one group's nodes of one GPU model (``gpu_model``)
    holding the same ``weights`` of the shape's models — in order, each with the range of its rack's use
    within which its step holds.

    ``bases`` are the candidates' own parts — ``((pack, name), draw, added, out)``: bin packing and the
    name, the shard's draw and what it adds to the domains' use, and the node's ``unavailable_reason`` —
    and ``order`` their entries (:func:`_entry_of`), sorted; ``entries`` finds a candidate's. The order
    is right while the rack's use is within (``low``, ``high``), every entry's range; above ``low``, no
    entry's key is earlier than kept. ``version`` counts the changes of the order, and of what the filters
    read of its candidates (a walk through the slate is walked again).
    """

    __slots__ = (
        "sid", "group", "gpu_model", "weights", "scores", "bases", "entries", "order", "low", "high", "version",
        "changes",
    )

    def __init__(
        self, sid: int, group: _Group, gpu_model: str | None, weights: frozenset[str], scores: tuple, changes: _Log
    ) -> None:
        self.sid = sid
        self.group = group
        self.gpu_model = gpu_model
        self.weights = weights
        self.scores = scores  # the keys of the scorers not built in, for the shape's one model
        self.bases: dict[str, tuple] = {}
        self.entries: dict[str, tuple] = {}
        self.order: list[tuple] = []
        self.low = -_INFINITY
        self.high = _INFINITY
        self.version = 0
        self.changes = changes  # the shape's: each change of version is added to it

    def changed(self) -> None:
        """Its order, or what the filters read of a candidate, changed: a walk through it is walked again."""
        self.version += 1
        self.changes.add(self)

    def is_current(self) -> bool:
        """True when every entry's step is right at the rack's use of now."""
        cell = self.group.step_cell
        return cell is None or self.low < cell.use < self.high

    def fill(self) -> None:
        """The order made from ``bases``, at the rack's use of now."""
        cell = self.group.step_cell
        entries = self.entries
        low, high = -_INFINITY, _INFINITY
        if cell is None:
            for name, base in self.bases.items():
                entries[name] = _entry_of(base, cell)
        else:
            stepped = cell.stepped
            for name, base in self.bases.items():  # _entry_of's, spelt out: a new shape steps every candidate
                (pack, _), draw, added, out = base
                if added is None:
                    entries[name] = (-FULL_HEADROOM, pack, name), draw, added, FULL_HEADROOM, out, -_INFINITY, _INFINITY
                    continue
                step, below, above = stepped(added)
                entries[name] = (-step, pack, name), draw, added, step, out, below, above
                if below > low:
                    low = below
                if above < high:
                    high = above
        self.order = sorted(entries.values())
        self.low, self.high = low, high
        self.changed()

    def put(self, name: str, base: tuple) -> tuple:
        """Add a candidate at the rack's use of now; its entry."""
        entry = self.entries[name] = _entry_of(base, self.group.step_cell)
        self.bases[name] = base
        insort(self.order, entry)
        if entry[5] > self.low:
            self.low = entry[5]  # no earlier key while the use stays above this candidate's range too
        if entry[6] < self.high:
            self.high = entry[6]
        self.changed()
        return entry

    def redraw(self, name: str, base: tuple) -> bool:
        """A candidate's new draw and use added (a reading moved them) in its place, when its key stays; False,
        changing nothing, when it would move. Its version stays: a walk's power refusals read a use that moved
        (the reading's) and are worded again from the entry; its other reasons read neither."""
        entry = _entry_of(base, self.group.step_cell)
        old = self.entries[name]
        if entry[0] != old[0]:
            return False
        order = self.order
        order[bisect_left(order, old)] = self.entries[name] = entry
        self.bases[name] = base
        if entry[5] > self.low:
            self.low = entry[5]
        if entry[6] < self.high:
            self.high = entry[6]
        return True

    def take(self, name: str) -> None:
        """Take a candidate out (the range stays as narrow: a later repair widens it)."""
        entry = self.entries.pop(name)
        del self.bases[name]
        order = self.order
        del order[bisect_left(order, entry)]
        self.changed()

    def repair(self) -> None:
        """Step again the entries whose range the rack's use left, and put them in order."""
        cell = self.group.step_cell
        use, limit = cell.use, cell.limit
        low, high = -_INFINITY, _INFINITY
        order, entries = self.order, self.entries
        moved = False
        for at, entry in enumerate(order):
            below, above = entry[5], entry[6]
            if not below < use < above:
                (_, pack, name), draw, added, _, out, _, _ = entry
                step, below, above = _stepped(limit, use, added)  # most are new figures: not kept
                order[at] = entries[name] = ((-step, pack, name), draw, added, step, out, below, above)
                moved = True
            if below > low:
                low = below
            if above < high:
                high = above
        if moved:
            order.sort()
            self.changed()
        self.low, self.high = low, high


class _Shape:
    """What the rankings of one shard shape share: the cards a shard asks (``gpus``: who is a candidate,
    and bin packing) and how its draw is counted (``profile`` stands for them: draw_of). Its slates, by
    ``(group, GPU model, weights of its models)`` and by id; the slate each candidate is in; the slates of
    each rack (its use steps them); the log of slates whose first key came earlier (``improved``, from
    position ``improved_start``), for the rankings to move them up in their heaps; and the models ranked
    on it (``models``): the weights a slate tells apart. Weights of other models put a node first for
    none of them, so its slate is theirs; a model ranked on the shape later moves the nodes holding its
    weights to slates of their own, as a node whose weights changed moves.

    With scorers registered that are not built in (``scorers``), its slates tell their keys apart too: a
    slate's ``scores`` are its nodes' keys for each model and profile ranked on it (``members``, in the
    order they came; ``placings`` ask them), kept in ``kept`` while what they read of a node stays; within a
    slate they are alike, so its order holds. A member ranked on it later makes it again."""

    __slots__ = (
        "profile", "gpus", "draws", "slates", "by_id", "of_node", "in_rack", "of_group", "improved", "improved_start",
        "changes", "models", "scorers", "members", "placings", "kept",
    )

    def __init__(self, profile: Profile, models: frozenset[str], scorers: tuple = (), members: tuple = (),
                 placings: tuple = (), kept: dict | None = None) -> None:
        self.profile = profile
        self.models = models
        self.scorers = scorers
        self.members = members
        self.placings = placings
        kept = {} if kept is None else kept
        # Each member's kept keys by node, found once (a profile's hash is worked out afresh each time).
        self.kept = tuple(kept.setdefault(member, {}) for member in members)
        self.gpus = profile.gpus
        self.draws: dict[float | None, float | None] = {}  # by the node's card limit
        self.slates: dict[tuple, _Slate] = {}
        self.by_id: list[_Slate] = []
        self.of_node: dict[str, _Slate] = {}
        self.in_rack: dict[_Cell, list[_Slate]] = {}  # by the rack's cell (new cells make new shapes)
        self.of_group: dict[_Group, list[_Slate]] = {}
        self.improved: list[int] = []
        self.improved_start = 0
        self.changes = _Log()

    def scores_of(self, node: NodeView) -> tuple:
        """The keys of the scorers not built in for the node, for each member (model and profile), kept."""
        if not self.scorers:
            return ()
        name, score, scorers = node.name, REGISTRY.score, self.scorers
        keys = []
        for known, placing in zip(self.kept, self.placings, strict=True):
            mine = known.get(name)
            if mine is None:
                mine = known[name] = tuple(score(item, node, placing) for item in scorers)
            keys.append(mine)
        return tuple(keys)

    def weights_of(self, node: NodeView) -> frozenset[str]:
        """The node's weights that a slate of this shape tells apart: its models'."""
        weights = node.weights
        return weights & self.models if weights else weights

    def slate(self, group: _Group, gpu_model: str | None, weights: frozenset[str], scores: tuple = ()) -> _Slate:
        """The slate of these alike nodes (``weights``: of the shape's models; ``scores``: the keys of the
        scorers not built in, for its one model), made when first asked."""
        kind = (group, gpu_model, weights, scores)  # one group to a tuple of domains: it stands for them
        slate = self.slates.get(kind)
        if slate is None:
            slate = self.slates[kind] = _Slate(len(self.by_id), group, gpu_model, weights, scores, self.changes)
            self.by_id.append(slate)
            self.of_group.setdefault(group, []).append(slate)
            if group.step_cell is not None:
                self.in_rack.setdefault(group.step_cell, []).append(slate)
        return slate

    def improve(self, slate: _Slate, first: tuple | None) -> None:
        """Log the slate when its first key came earlier than ``first`` (its first entry's before)."""
        if slate.order and (first is None or slate.order[0][0] < first):
            self.improved.append(slate.sid)
            if len(self.improved) > _IMPROVEMENTS_KEPT:
                drop = len(self.improved) - _IMPROVEMENTS_KEPT // 2
                del self.improved[:drop]
                self.improved_start += drop


# The built-in scorers the index keeps in its own form (by group, slate and entry: the module's docstring),
# and the layout of its keys: (spread, condition, headroom step, tokens per joule, weights, bin packing, name).
_OWN_SCORERS = ("spread", "condition", "headroom", "tokens-per-joule", "weights", "pack")
_PLAIN_MIDDLE = (("own", "tokens-per-joule"), ("own", "weights"))
_layouts: dict[int, tuple] = {}


def _scorers_laid_out() -> tuple:
    """The registered scorers as the index ranks by them: (layout, others). ``others`` are the scorers it
    has no form of its own for (each node's key worked out and kept: _Shape.scores_of); ``layout`` is None
    without any, else where each of their keys goes among the index's own, by the registry's order: the
    four places between them (before spread; between spread and the headroom step, with condition; between
    it and bin packing, with tokens per joule and weights; after bin packing), each a list of ("own", id)
    or ("other", its place in ``others``)."""
    known = _layouts.get(REGISTRY.version)
    if known is not None:
        return known
    others = tuple(item for item in REGISTRY.scorers if item.id not in _OWN_SCORERS)
    layout = None
    if others:
        layout = ([], [], [], [])
        region, other = 0, 0
        for item in REGISTRY.scorers:
            if item.id == "spread":
                region = 1
            elif item.id == "headroom":
                region = 2
            elif item.id == "pack":
                region = 3
            elif item.id in _OWN_SCORERS:
                layout[region].append(("own", item.id))
            else:
                layout[region].append(("other", other))
                other += 1
    _layouts.clear()
    known = _layouts[REGISTRY.version] = (layout, others)
    return known


def _shape_of(profile: Profile) -> tuple:
    """What of a profile decides who is a candidate, the draw (draw_of) and bin packing."""
    cores = profile.cpu_cores if profile.gpus == 0 and profile.power_watts is None else 0
    return profile.gpus, profile.power_watts, cores


class _Ranking:
    """One model and profile's view of its shape's slates, kept between its plans.

    ``heap`` holds ``(*bound, sid, version)`` of every slate with candidates but those the kept walk went
    through (one flat tuple: a comparison in the heap walks one tuple, not a tuple in a tuple); ``bounds``
    and ``versions`` are each slate's (entries of an older version are left behind and skipped),
    ``middles`` what the model puts in each slate's key beside the step, bin packing and name: ``(before
    spread, condition, efficiency, weights, after bin packing)`` — the first and last None, the second the
    group's rank, and the middle two its efficiency on the slate's GPU model and whether the slate holds its
    weights, unless scorers not built in are registered: their keys (the slate's ``scores``) then join these
    places in the registry's order (:func:`_scorers_laid_out`). ``existing`` and ``counts`` are the model's
    replicas as last asked and their spread counts, ``spread`` each group's; ``improved`` is how far into
    the shape's log this ranking caught up, ``epoch`` the index's epoch it was made in.
    """

    __slots__ = (
        "request", "shape", "bounds", "versions", "middles", "heap", "existing", "counts", "spread", "improved",
        "epoch", "walk", "checks", "member", "laid_out",
    )

    def __init__(self, request: ReplicaRequest, shape: _Shape, counts: dict[Domain, int], epoch: int) -> None:
        self.request = request
        self.shape = shape
        self.bounds: list[tuple | None] = []
        self.versions: list[int] = []
        self.middles: list[tuple] = []
        self.heap: list[tuple] = []
        self.existing = request.existing
        self.counts = counts
        self.spread: dict[_Group, int] = {}
        self.improved = shape.improved_start + len(shape.improved)
        self.epoch = epoch
        self.walk: _Walk | None = None
        self.checks = candidate_filters(request.profile, frozenset())  # a plan with exclusions asks its own
        member = (request.model, request.profile)
        self.member = shape.members.index(member) if member in shape.members else None  # its slates' scores
        self.laid_out = _scorers_laid_out()[0] is not None  # other scorers' keys among the built-ins'

    def learn(self) -> None:
        """Take in the slates the shape made since this ranking last looked."""
        profile, model = self.request.profile, self.request.model
        layout = _scorers_laid_out()[0]
        for slate in self.shape.by_id[len(self.bounds) :]:
            self.bounds.append(None)
            self.versions.append(0)
            efficiency = -efficiency_of(slate.gpu_model, profile)
            weights = 0 if model in slate.weights else 1
            rank = slate.group.rank
            if layout is None:
                self.middles.append((efficiency, weights))  # the key's places as the built-ins have them
                continue
            own = {"condition": rank, "tokens-per-joule": efficiency, "weights": weights}
            scores = slate.scores[self.member]
            before, head, middle, after = (
                tuple(own[at] if kind == "own" else scores[at] for kind, at in region) for region in layout
            )
            if layout[1] == [("own", "condition")]:
                head = rank
            if layout[2] == list(_PLAIN_MIDDLE):
                efficiency_part, weights_part = efficiency, weights
            else:
                efficiency_part, weights_part = middle, 0
            self.middles.append((before or None, head, efficiency_part, weights_part, after or None))

    def key_at(self, slate: _Slate, at: int) -> tuple:
        """The ranking key of the candidate at ``at`` in the slate's order (the registered scorers' keys, in
        the index's places: ``middles``)."""
        step, pack, name = slate.order[at][0]
        group = slate.group
        if not self.laid_out:
            efficiency, weights = self.middles[slate.sid]
            return (self.spread[group], group.rank, step, efficiency, weights, pack, name)
        before, rank, efficiency, weights, after = self.middles[slate.sid]
        spread = self.spread[group]
        return (
            spread if before is None else (*before, spread), rank, step, efficiency, weights,
            pack if after is None else (pack, *after), name,
        )


class _Walk:
    """The candidates a plan passed over before its choice, kept for the ranking's next plan: their
    rejections in rank order (and each reason's count), and beside each, in ``trail``, the slate and
    position it came from and whether a power refusal it is; each walked slate's last position passed
    over (``last``) and where the next plan goes on in it (``frontier``); where the shape's log of changed
    slates and the index's of changed uses stood when it was made (``changes``, ``uses``: what moved since
    is read off them, not asked of each walked slate); the budgeted domains whose refusals it read (their
    versions, and ``reads``: by group, the power refusals among the places passed over, as trail entries in
    a dict kept as an ordered set, carried over by a replay); the exclusions it was made with; the last key
    passed over (``end``).

    The next plan takes it up as it is when nothing of it moved. Else it replays it, merged with the heap
    in rank order: the candidates of the slates that did not move are passed over again for their kept
    reasons, those of the slates that did (``moved`` as they are caught up on: a group whose spread rose,
    a walked slate whose first key came earlier; and at the take-up, a walked slate that changed or whose
    rack's use left its range) go back into the heap and are walked again, and a candidate come in ahead
    of the last one passed over (``improved``) takes its place among them. A power refusal whose domain's
    use moved is worded again at the use of now (a full rack's readings move its use all the time); one
    that no longer refuses moves its slate. A lost room's held nodes and the full racks, passed over by
    each of its replacements, are so passed over again at the cost of merging them, not of checking each.
    """

    __slots__ = ("rejections", "reasons", "trail", "last", "frontier", "changes", "uses", "cells", "reads", "exclude",
                 "end", "moved", "improved")

    def __init__(self, rejections: dict[str, str], reasons: dict[str, int], trail: list[tuple[_Slate, int, bool]],
                 last: dict[_Slate, int], frontier: list[tuple] | None, changes: int, uses: int, cells: dict,
                 reads: dict, exclude: frozenset[str], end: tuple) -> None:
        self.rejections = rejections
        self.reasons = reasons  # each rejection reason's count: the explain's summary, not counted again
        self.trail = trail
        self.last = last
        # Where the next plan goes on in each walked slate not walked to its end, as a heap of (key, slate
        # id, position); None when it is to be made again from ``last``.
        self.frontier = frontier
        self.changes = changes
        self.uses = uses
        self.cells = cells  # _Cell → its version when read
        self.reads = reads  # _Group → {trail entry: None} of its power refusals
        self.exclude = exclude
        self.end = end
        self.moved: set[_Slate] = set()
        self.improved = False


def _read(group: _Group, read: dict) -> None:
    """Note the versions of the group's cells as a walk's power refusal read them (the first read holds)."""
    for cell in group.cells:
        if cell not in read:
            read[cell] = cell.version


def _reword_one(slate: _Slate, position: int, moved: set, rejections: dict, reasons: dict) -> None:
    """A kept power refusal worded again at the use of now; its slate ``moved`` when it no longer refuses."""
    key, draw, added, _, _, _, _ = slate.order[position]
    old = rejections[key[2]]
    adds = added or 0.0
    reason = None
    for cell in slate.group.cells:  # the first that refuses, in level order, as plan_replica says it
        if cell.use + adds > cell.ceiling:
            reason = cell.refusal(draw, adds)
            if reason is not None:
                break
    if reason is None:
        moved.add(slate)
    elif old != reason:
        rejections[key[2]] = reason
        if reasons[old] == 1:
            del reasons[old]
        else:
            reasons[old] -= 1
        reasons[reason] = reasons.get(reason, 0) + 1


def _passed(reads: dict, last: dict) -> dict:
    """``reads`` with only the refusals at or before their slate's last place passed over (a slate's places
    are passed over in order)."""
    kept = {}
    for group, places in reads.items():
        places = {entry: None for entry in places if last.get(entry[0], -1) >= entry[1]}
        if places:
            kept[group] = places
    return kept


class _Replay:
    """The places of a kept walk to pass over again (those of the slates that did not move), in rank order:
    their trail entries (slate, position, is a power refusal), names and reasons (the power refusals' reads
    are carried over with the walk's). Their keys did not change (a slate whose did is moved), so the places
    before a key are found by bisection and passed over in bulk: a long walk (a full room, walked by each of
    its replacements) costs its length in copies, not in steps of the plan's loop."""

    __slots__ = ("trail", "names", "whys", "size", "_key_at")

    def __init__(self, trail: list[tuple], names: list[str], whys: list[str], key_at) -> None:
        self.trail = trail
        self.names = names
        self.whys = whys
        self.size = len(trail)
        self._key_at = key_at

    def key(self, at: int) -> tuple:
        """The ranking key of the place ``at``."""
        slate, position, _ = self.trail[at]
        return self._key_at(slate, position)

    def pass_over(self, start: int, bound: tuple | None, rejections: dict, trail: list, last: dict) -> int:
        """Pass over again, as kept, the places from ``start`` whose key is before ``bound`` (every one left
        when None); where the replay now stands. The plan counts the reasons once at its end."""
        stop = self.size
        if bound is not None:
            stop = bisect_left(self.trail, bound, start, stop, key=lambda entry: self._key_at(entry[0], entry[1]))
        if stop <= start:
            return start
        chunk = self.trail[start:stop]
        rejections.update(zip(self.names[start:stop], self.whys[start:stop], strict=True))
        trail.extend(chunk)
        last.update(zip(map(itemgetter(0), chunk), map(itemgetter(1), chunk), strict=True))
        return stop


_NO_REPLAY = _Replay([], [], [], None)
_said_plain: set[str] = set()


def _say_plain(reason: str) -> None:
    """Log, once a process for each reason, that the index plans the plain way."""
    if reason not in _said_plain and len(_said_plain) < 64:
        _said_plain.add(reason)
        log.warning("placement plans the plain way, every node asked every rule (slower): %s", reason)


class PlacementIndex:
    """Node state and domain use for a run of placements; plan with :meth:`plan`, commit with :meth:`apply`.

    Not thread-safe: one reconcile owns one index. Feed it what changed (``update_node``,
    ``remove_node``, ``set_facility``); a lost race at commit means the Django side refreshes
    the node from the store with ``update_node`` and plans again.
    """

    def __init__(self, nodes: Iterable[NodeView], facility: FacilityView) -> None:
        self._facility = facility
        self._cells: dict[Domain, _Cell] = {}
        self._uses = _Log()  # the cells whose use changed, in order
        self._nodes: dict[str, _Entry] = {}
        self._groups: dict[tuple[Domain, ...], _Group] = {}
        self._groups_in: dict[Domain, list[_Group]] = {}  # the groups in each rack and PDU
        self._holding: dict[str, set[str]] = {}  # each model's weights: the nodes holding them
        self._rankings: dict[tuple, _Ranking] = {}
        self._shapes: dict[tuple, _Shape] = {}
        # Moves when every shape and ranking must be made afresh: new facility figures, a node come, gone
        # or moved (groups and spread counts change).
        self._epoch = 0
        self._rules = REGISTRY.version  # the registry's rules the kept keys and verdicts are of
        # The keys of the scorers not built in, by (model, profile) and node (_Shape.scores_of).
        self._scores: dict[tuple, dict[str, tuple]] = {}
        self._members: dict[tuple, int] = {}  # each (model, profile) planned: its number, for kept verdicts
        for node in nodes:
            if node.name in self._nodes:
                raise ValueError(f"node {node.name!r} is listed twice")
            self._add(node)
        self.set_facility(facility)

    # --- reading --------------------------------------------------------------------------------

    @property
    def facility(self) -> FacilityView:
        """The facility figures plans are made against."""
        return self._facility

    def node(self, name: str) -> NodeView:
        """The indexed view of one node (KeyError when unknown)."""
        return self._nodes[name].node

    def nodes(self) -> tuple[NodeView, ...]:
        """Every indexed node, by name."""
        return tuple(self._nodes[name].node for name in sorted(self._nodes))

    def use_watts(self, domain: Domain) -> float | None:
        """A budgeted domain's use as the index counts it; None for a domain without a budget."""
        cell = self._cells.get(domain)
        return None if cell is None else cell.use

    # --- keeping it current ---------------------------------------------------------------------

    def update_node(self, node: NodeView) -> None:
        """Add a node, or replace its view (a heartbeat, a label change, a refresh after a lost race)."""
        old = self._nodes.get(node.name)
        if old is not None and old.node.domains == node.domains:
            if old.node != node:
                self._replace(old, node)
            return
        if old is not None:
            self._drop(old)
        self._add(node)
        self._afresh()  # a node came, or moved: groups and spread counts change

    def remove_node(self, name: str) -> None:
        """Forget a node (deleted); unknown names are ignored."""
        old = self._nodes.get(name)
        if old is not None:
            self._drop(old)
            self._afresh()

    def set_facility(self, facility: FacilityView) -> None:
        """New settings, budgets, holds or conditions: holds, verdicts and domain use are worked out again."""
        self._facility = facility
        margin = facility.settings.margin
        self._uses = _Log()
        self._cells = {domain: _Cell(budget, margin, self._uses) for domain, budget in facility.budgets.items()}
        for group in self._groups.values():
            group.set_cells(self._cells)
            group.set_conditions(facility)
        for name, entry in self._nodes.items():
            entry.held = blocked_reason(entry.node, facility)
            entry.adds = {}
            entry.verdicts = {}
            term = entry.term = self._term(entry.node)
            for cell in entry.group.cells:
                cell.count(name, term)
        self._afresh()

    def apply(self, plan: Plan) -> None:
        """Record a committed (or dry-run) plan: free cards, cores, memory, placed watts, replicas."""
        for shard in plan.shards:
            self.apply_shard(shard)

    def apply_shard(self, shard: ShardPlan) -> None:
        """Record one committed shard (the node stays where it is, and changes: no need to compare)."""
        entry = self._nodes[shard.node]
        self._replace(entry, apply_shard(entry.node, shard))

    def _afresh(self) -> None:
        """Every shape and ranking is made afresh when next asked."""
        self._epoch += 1
        self._shapes = {}

    def _term(self, node: NodeView) -> float:
        return node_use_watts(node.placed_watts, node.measured_watts, self._facility.settings)

    def _add(self, node: NodeView) -> None:
        group = self._groups.get(node.domains)
        if group is None:
            group = self._groups[node.domains] = _Group(node.domains)
            for domain in group.spread:
                self._groups_in.setdefault(domain, []).append(group)
            group.set_cells(self._cells)
            group.set_conditions(self._facility)
        term = self._term(node)
        self._nodes[node.name] = _Entry(node, group, blocked_reason(node, self._facility), term)
        self._hold(node.name, node.weights, True)
        _insert(group.by_free, len(node.free_gpus), node.name)
        _insert(group.by_replicas, node.replicas, node.name)
        for cell in group.cells:
            cell.count(node.name, term)

    def _drop(self, entry: _Entry) -> None:
        node, group = entry.node, entry.group
        del self._nodes[node.name]
        for scores in self._scores.values():
            scores.pop(node.name, None)
        self._hold(node.name, node.weights, False)
        _remove(group.by_free, len(node.free_gpus), node.name)
        _remove(group.by_replicas, node.replicas, node.name)
        for cell in group.cells:
            cell.count(node.name, None)

    def _hold(self, name: str, weights: frozenset[str], holds: bool) -> None:
        """Note that the node holds (or no longer holds) these models' weights."""
        holding = self._holding
        for model in weights:
            if holds:
                holding.setdefault(model, set()).add(name)
            else:
                names = holding[model]
                names.discard(name)
                if not names:
                    del holding[model]

    def _replace(self, entry: _Entry, node: NodeView) -> None:
        """The node's new view in its place (same domains: same group, same hold): its term's change goes
        to its domains' use, its entry to its place in each shape; a rack whose use fell below a slate's
        range steps that slate again."""
        old = entry.node
        group = entry.group
        entry.node = node
        entry.adds = {}
        if old.weights != node.weights:
            self._hold(node.name, old.weights, False)
            self._hold(node.name, node.weights, True)
        if len(old.free_gpus) != len(node.free_gpus):
            _remove(group.by_free, len(old.free_gpus), node.name)
            _insert(group.by_free, len(node.free_gpus), node.name)
        if old.replicas != node.replicas:
            _remove(group.by_replicas, old.replicas, node.name)
            _insert(group.by_replicas, node.replicas, node.name)
        fell = False
        term = self._term(node)
        change = term - entry.term
        entry.term = term
        if change and group.cells:
            for cell in group.cells:
                cell.count(node.name, term)
            fell = change < 0 and group.step_cell is not None  # steps rise only as the use falls
        # A kept walk passes the node over again for its reason only while what the filters read stays.
        refiltered = filter_inputs(old) != filter_inputs(node)
        if refiltered and entry.verdicts and rule_inputs(old, "other filters") != rule_inputs(node, "other filters"):
            entry.verdicts = {}
        if self._scores and rule_inputs(old, "other scorers") != rule_inputs(node, "other scorers"):
            for scores in self._scores.values():  # its keys of the scorers not built in are worked out again
                scores.pop(node.name, None)
        # A walk's power refusals are worded again when their domains' use moves: a candidate whose figures
        # moved with its use keeps its place (and the walks through it) while its key stays.
        redrawn = not refiltered and (bool(change) or not group.cells)
        for shape in self._shapes.values():
            self._reshape(shape, entry, refiltered, redrawn)
            if fell:
                use = group.step_cell.use
                for slate in shape.in_rack.get(group.step_cell, ()):
                    if slate.order and use <= slate.low:  # a step may have risen: an earlier key
                        first = slate.order[0][0]
                        slate.repair()
                        shape.improve(slate, first)

    # --- the shapes and rankings ----------------------------------------------------------------

    def _base(self, shape: _Shape, entry: _Entry) -> tuple | None:
        """A node's own part of its key in a shape — ``((pack, name), draw, added, out)`` — or None when it
        has too few free cards to be a candidate at all (the built-in scorers' parts, shared)."""
        node = entry.node
        gpus = shape.gpus
        free = len(node.free_gpus)
        if gpus > 0 and free < gpus:
            return None
        limit = node.gpu_power_limit_watts
        draws = shape.draws
        if limit in draws:
            draw = draws[limit]
        else:
            draw = draws[limit] = draw_of(node, shape.profile, self._facility.settings)
        adds = entry.adds
        if draw in adds:
            added = adds[draw]
        elif draw is None:
            added = adds[draw] = None  # added_of's: a draw nobody knows adds nothing known
        else:
            added = adds[draw] = node_use_added_watts(
                node.placed_watts, node.measured_watts, draw, self._facility.settings, before=entry.term
            )
        pack = free - gpus if gpus > 0 else node.replicas  # pack_value
        return (pack, node.name), draw, added, unavailable_reason(node, entry.held)

    def _reshape(self, shape: _Shape, entry: _Entry, refiltered: bool, redrawn: bool = False) -> None:
        """The node's entry in the shape, after its view changed (``refiltered``: in what the filters read;
        ``redrawn``: only in its reading, which moved its domains' use)."""
        node = entry.node
        name = node.name
        was = shape.of_node.get(name)
        base = self._base(shape, entry)
        if base is None:
            if was is not None:
                was.take(name)
                del shape.of_node[name]
            return
        gpu_model = node.labels.get("gpu.model")
        weights = shape.weights_of(node)
        scores = shape.scores_of(node)
        if was is not None and was.gpu_model == gpu_model and was.weights == weights and was.scores == scores:
            slate = was
            kept = slate.bases[name]
            if kept == base:
                if refiltered:
                    slate.changed()  # in the same place, but a walk through it is walked again
                return  # a reading that moves nothing of this shape's (measured below placed)
            if redrawn and kept[0] == base[0] and kept[1] == base[1] and kept[3] == base[3] and slate.redraw(name, base):
                return  # a reading within its step: the same place, only the power figures moved
        else:
            slate = shape.slate(entry.group, gpu_model, weights, scores)
        if was is not None:
            was.take(name)
        first = slate.order[0][0] if slate.order else None
        slate.put(name, base)
        shape.of_node[name] = slate
        shape.improve(slate, first)

    def _shape(self, profile: Profile, model: str) -> _Shape:
        """The profile's shape with ``model`` among its models, made when first asked."""
        others = _scorers_laid_out()[1]
        kind = _shape_of(profile)
        shape = self._shapes.get(kind)
        member = (model, profile)
        members: tuple = ()
        if others:
            # Scorers not built in: a member that comes makes the shape again, its slates telling the new
            # member's keys apart too (the other members' rankings are made again when next asked).
            if shape is not None and member in shape.members:
                return shape
            members = (*(shape.members if shape is not None else ()), member)
            models = frozenset(m for m, _ in members)
        elif shape is not None:
            if model not in shape.models:
                self._join(shape, model)
            return shape
        else:
            models = frozenset((model,))
        placings = tuple(Placing(ReplicaRequest(model=m, profile=p), self._facility) for m, p in members)
        # The keys are kept beyond the shape, while the node stays (the index's _scores).
        shape = self._shapes[kind] = _Shape(profile, models, others, members, placings, self._scores)
        gpus = profile.gpus
        nodes, of_node, base_of, weights_of = self._nodes, shape.of_node, self._base, shape.weights_of
        for group in self._groups.values():
            buckets = group.by_free if gpus > 0 else group.by_replicas
            slates: dict[tuple, _Slate] = {}  # the group's, by GPU model, weights and other scorers' keys
            for bucket, names in buckets.items():
                if bucket < gpus:
                    continue  # too few free cards: no candidate (the others have enough, _base's test)
                for name in names:
                    entry = nodes[name]
                    node = entry.node
                    alike = (node.labels.get("gpu.model"), weights_of(node), shape.scores_of(node))
                    slate = slates.get(alike)
                    if slate is None:
                        slate = slates[alike] = shape.slate(group, *alike)
                    of_node[name] = slate
                    slate.bases[name] = base_of(shape, entry)
        for slate in shape.by_id:
            slate.fill()
        return shape

    def _join(self, shape: _Shape, model: str) -> None:
        """A model ranked on the shape for the first time: the candidates holding its weights move to slates
        of their own (by name: the slates' ids come in one order whatever the run)."""
        shape.models = shape.models | {model}
        of_node, nodes = shape.of_node, self._nodes
        for name in sorted(self._holding.get(model, ())):
            if name in of_node:
                self._reshape(shape, nodes[name], False)

    def _ranking(self, request: ReplicaRequest) -> _Ranking:
        """The request's kept ranking, caught up with what changed since its last plan, or made afresh."""
        kind = (request.model, request.profile)
        ranking = self._rankings.pop(kind, None)
        existing = request.existing
        if (
            ranking is None
            or ranking.epoch != self._epoch
            or self._shapes.get(_shape_of(request.profile)) is not ranking.shape  # made again meanwhile
            or ranking.improved < ranking.shape.improved_start
            or len(existing) < len(ranking.existing)
            or existing[: len(ranking.existing)] != ranking.existing
        ):
            ranking = self._rank_afresh(request)
        else:
            self._catch_up(ranking, request)
        if len(self._rankings) >= _RANKINGS_KEPT:
            dropped = self._rankings.pop(next(iter(self._rankings)))
            shape = dropped.shape
            if all(other.shape is not shape for other in self._rankings.values()) and shape is not ranking.shape:
                kind_of = next((k for k, s in self._shapes.items() if s is shape), None)
                if kind_of is not None:
                    del self._shapes[kind_of]  # its nodes' changes cost every placement something
        self._rankings[kind] = ranking  # the most recent last: the oldest goes first
        return ranking

    def _rank_afresh(self, request: ReplicaRequest) -> _Ranking:
        counts = spread_counts(request.existing, _NodesOf(self._nodes))
        shape = self._shape(request.profile, request.model)
        ranking = _Ranking(request, shape, counts, self._epoch)
        for group in self._groups.values():
            ranking.spread[group] = spread_of(group.spread, counts)
        ranking.learn()
        bounds, heap = ranking.bounds, ranking.heap
        for slate in shape.by_id:
            if slate.order:
                # Its entries' keys as kept are never later than at the use of now: a lower bound.
                bound = bounds[slate.sid] = ranking.key_at(slate, 0)
                heap.append((*bound, slate.sid, 0))
        heapify(heap)
        return ranking

    def _catch_up(self, ranking: _Ranking, request: ReplicaRequest) -> None:
        """Raise the spread of the groups in the racks and PDUs the model's new replicas went to (a later
        key: where their slates sit in the heap stays a lower bound), and move up in the heap the slates
        whose first key came earlier since the last plan."""
        walk = ranking.walk
        existing = request.existing
        if len(existing) > len(ranking.existing):
            counts, spread, nodes = ranking.counts, ranking.spread, self._nodes
            for replica in existing[len(ranking.existing) :]:
                # spread_counts' for one replica: once in each rack and PDU of its nodes (a group's spread
                # domains are its nodes' racks and PDUs).
                entries = [nodes[name] for name in replica if name in nodes]
                domains = entries[0].group.spread if len(entries) == 1 else {
                    domain for entry in entries for domain in entry.group.spread
                }
                for domain in domains:
                    counts[domain] = counts.get(domain, 0) + 1
                    for group in self._groups_in.get(domain, ()):
                        spread[group] += 1  # spread_of: the sum of its racks' and PDUs' counts
                        if walk is not None:
                            for slate in ranking.shape.of_group.get(group, ()):
                                if slate in walk.last:
                                    walk.moved.add(slate)  # a walked slate's keys came later
        ranking.existing = existing
        ranking.request = request
        shape = ranking.shape
        log = shape.improved[ranking.improved - shape.improved_start :]
        ranking.improved = shape.improved_start + len(shape.improved)
        if not log:
            return
        ranking.learn()
        by_id, bounds = shape.by_id, ranking.bounds
        for sid in set(log):
            slate = by_id[sid]
            if not slate.order:
                continue
            key = ranking.key_at(slate, 0)
            if bounds[sid] is None or key < bounds[sid]:
                if walk is not None and slate in walk.last:
                    # Off the heap while walked: it goes back into the heap at the earlier key when the next
                    # plan takes up the walk.
                    walk.moved.add(slate)
                    bounds[sid] = key
                else:
                    self._push(ranking, slate, key)

    def _push(self, ranking: _Ranking, slate: _Slate, key: tuple) -> None:
        """Put the slate in the ranking's heap at ``key`` (its entries before are left behind)."""
        sid = slate.sid
        version = ranking.versions[sid] = ranking.versions[sid] + 1
        ranking.bounds[sid] = key
        heappush(ranking.heap, (*key, sid, version))
        walk = ranking.walk
        if walk is not None and key < walk.end:
            walk.improved = True  # a candidate may have come in ahead of a place in the trail

    def _walk_off(self, ranking: _Ranking) -> None:
        """Forget the kept walk: its slates go back into the heap where they were."""
        walk = ranking.walk
        if walk is None:
            return
        ranking.walk = None
        heap, bounds, versions = ranking.heap, ranking.bounds, ranking.versions
        for slate in walk.last:
            sid = slate.sid
            heappush(heap, (*bounds[sid], sid, versions[sid]))

    def _take_up(self, ranking: _Ranking, exclude: frozenset[str]) -> tuple | None:
        """The kept walk as the next plan starts from it (see _Walk): (rejections, reasons, trail, last, cells
        read, reads, the last key passed over, replay, frontier or None). ``replay`` is None when the walk is
        taken up as it is; else the walk starts empty and ``replay`` holds the places to pass over again, in
        rank order (:class:`_Replay`), the moved slates back in the heap. None, with every slate back, when
        nothing of it holds (other exclusions)."""
        walk = ranking.walk
        ranking.walk = None
        if exclude != walk.exclude:
            ranking.walk = walk
            self._walk_off(ranking)
            return None
        moved, last, cells = walk.moved, walk.last, walk.cells
        shape = ranking.shape
        changed = shape.changes.since(walk.changes)
        uses = self._uses.since(walk.uses)
        shifted = set()
        if changed is None or uses is None:
            moved.update(last)  # too long ago to tell: every walked slate is walked again
            for cell in cells:  # and so read again: the record starts from the use of now
                cells[cell] = cell.version
        else:
            walked = last.keys()
            moved.update(walked & changed)
            # A walked slate whose rack's use moved and left its range; a cell read whose use moved (each
            # change of a use moves its version and is logged: the walk's record of it tells).
            racks = set(uses)
            for slate in walked:
                if slate.group.step_cell in racks and not slate.is_current():
                    moved.add(slate)
            for cell, version in cells.items():
                if cell.version != version:
                    shifted.add(cell)
        # The last plan's rejections and reasons stay as it gave them (copied before a change); the rest of
        # the walk is this plan's.
        rejections, reasons, trail = walk.rejections, walk.reasons, walk.trail
        if shifted:
            rejections, reasons = dict(rejections), dict(reasons)
            self._reword(shifted, walk.reads, moved, rejections, reasons)
            for cell in shifted:
                cells[cell] = cell.version
        if not moved and not walk.improved:
            if not shifted:
                rejections, reasons = dict(rejections), dict(reasons)  # this plan adds to them
            return rejections, reasons, trail, last, cells, walk.reads, walk.end, None, walk.frontier
        heap, bounds, versions = ranking.heap, ranking.bounds, ranking.versions
        for slate in moved:  # walked again from the heap, where it was (or at its earlier key)
            sid = slate.sid
            heappush(heap, (*bounds[sid], sid, versions[sid]))
        gone = list(map(moved.__contains__, map(itemgetter(0), trail)))
        if True in gone:
            kept = list(map(not_, gone))
            replay = _Replay(
                list(compress(trail, kept)),
                list(compress(rejections, kept)),
                list(compress(rejections.values(), kept)),
                ranking.key_at,
            )
        else:
            replay = _Replay(trail, list(rejections), list(rejections.values()), ranking.key_at)
        last = dict(last)
        reads = dict(walk.reads)
        for slate in moved:
            last.pop(slate, None)
            places = reads.get(slate.group)
            if places:
                reads[slate.group] = {entry: None for entry in places if entry[0] not in moved}
        frontier = walk.frontier
        if frontier is not None:
            by_id = shape.by_id
            frontier = [entry for entry in frontier if by_id[entry[1]] not in moved]
            heapify(frontier)
        return {}, {}, [], last, cells, reads, None, replay, frontier

    @staticmethod
    def _reword(shifted: set, reads: dict, moved: set, rejections: dict, reasons: dict) -> None:
        """The power refusals that read a domain whose use moved (``shifted``), worded again at the use of
        now (in place: the order stays); a slate with one that no longer refuses is ``moved``."""
        seen = set()
        for cell in shifted:
            for group in cell.groups:
                places = reads.get(group)
                if places and group not in seen:
                    seen.add(group)
                    for slate, position, _ in places:
                        if slate not in moved:
                            _reword_one(slate, position, moved, rejections, reasons)

    def _top(self, ranking: _Ranking) -> tuple | None:
        """The heap's first entry once it is exact (left-behind entries dropped, the slate at the top
        stepped at the use of now and at its true first key), or None when the heap is empty."""
        heap, versions, bounds = ranking.heap, ranking.versions, ranking.bounds
        spread, middles, laid_out = ranking.spread, ranking.middles, ranking.laid_out
        shape = ranking.shape
        by_id = shape.by_id
        while heap:
            top = heap[0]
            sid, version = top[7], top[8]
            if version != versions[sid]:
                heappop(heap)
                continue
            slate = by_id[sid]
            order, group = slate.order, slate.group
            cell = group.step_cell
            if cell is not None and not slate.low < cell.use < slate.high:
                first = order[0][0] if order else None
                slate.repair()  # for every ranking of the shape
                shape.improve(slate, first)
            if not order:
                bounds[sid] = None
                heappop(heap)
                continue
            step, pack, name = order[0][0]
            if laid_out:  # key_at's, spelt out
                before, rank, efficiency, weights, after = middles[sid]
                first = (
                    spread[group] if before is None else (*before, spread[group]), rank, step, efficiency, weights,
                    pack if after is None else (pack, *after), name,
                )
            else:
                efficiency, weights = middles[sid]
                first = (spread[group], group.rank, step, efficiency, weights, pack, name)
            if first != top[:7]:  # a later key: the rack's use, the spread or the slate moved
                version = versions[sid] = version + 1
                bounds[sid] = first
                top = (*first, sid, version)
                size = len(heap)
                if (size < 2 or top < heap[1]) and (size < 3 or top < heap[2]):
                    heap[0] = top  # still before both children: no need to sift it down
                    return top
                heapreplace(heap, top)
                continue
            return top
        return None

    # --- planning -------------------------------------------------------------------------------

    def plan(self, request: ReplicaRequest, *, exclude: frozenset[str] = frozenset()) -> Plan | NoFit:
        """Plan one replica on the indexed state; the same answer as ``plan_replica`` would give."""
        profile = request.profile
        if self._rules != REGISTRY.version:  # a rule registered or removed: every kept key and verdict goes
            self._rules = REGISTRY.version
            self._afresh()
            self._scores = {}
            for entry in self._nodes.values():
                entry.verdicts = {}
        plugged = REGISTRY.has_external
        # A rule not built in that does not say what it reads of a node has no kept form here: the plain
        # path, so the two stay equal. So for one failing now: the plans kept are made afresh after it (a
        # failure's words are not kept for the nodes it was asked of).
        if plugged:
            plain = REGISTRY.plain_path_reason()
            if plain is not None:
                _say_plain(plain)
                self._afresh()
                self._scores = {}  # a failing scorer's neutral keys are not kept either
                for entry in self._nodes.values():
                    entry.verdicts = {}
                return plan_replica(request, self.nodes(), self._facility, exclude=exclude)
        if profile.nodes > 1 or not self._nodes:
            return plan_replica(request, self.nodes(), self._facility, exclude=exclude)
        ranking = self._ranking(request)
        placing = Placing(request, self._facility, exclude=exclude, counts=ranking.counts)
        others = [item for item in REGISTRY.filters if not item.builtin] if plugged else ()
        verdict = self._members.setdefault((request.model, profile), len(self._members)) if others else None
        kept = self._take_up(ranking, exclude) if ranking.walk is not None else None
        frontier: list[tuple] = []
        replay = _NO_REPLAY
        waiting: set[_Slate] = set()
        if kept is not None:
            # The candidates the last plan passed over: passed over again for their kept reasons (a lost
            # room's 2,500 held nodes, walked by each of its replacements), as they are or merged anew.
            rejections, reasons, trail, last, read, reads, end, replayed, kept_frontier = kept
            if kept_frontier is not None:
                frontier = kept_frontier
            else:
                for slate, at in last.items():
                    if at + 1 < len(slate.order):
                        frontier.append((ranking.key_at(slate, at + 1), slate.sid, at + 1))
                heapify(frontier)
            if replayed is not None:
                replay = replayed
                waiting = set(last)  # off the heap: back into it at the end unless passed over again
                last = {}
        else:
            rejections, reasons, trail, last, read, reads, end = {}, {}, [], {}, {}, {}, None
        heap, by_id, nodes = ranking.heap, ranking.shape.by_id, self._nodes
        spread, middles, laid_out = ranking.spread, ranking.middles, ranking.laid_out
        checks = candidate_filters(profile, exclude) if exclude else ranking.checks
        checked = None  # the heap's first entry, once _top made it exact (nothing moves during a plan)
        played = 0  # how much of the replay is passed over again
        while True:
            top = heap[0] if heap and heap[0] is checked else self._top(ranking)
            checked = top
            if played < replay.size:
                # The replay's places before the other sources' first key are passed over again, as kept.
                bound = frontier[0][0] if frontier else None
                if top is not None and (bound is None or top[:7] < bound):
                    bound = top[:7]
                played = replay.pass_over(played, bound, rejections, trail, last)
                if played == replay.size and top is None and not frontier:
                    break
            if frontier and (top is None or frontier[0][0] < top[:7]):
                _, sid, at = heappop(frontier)
            elif top is not None:
                sid = heappop(heap)[7]
                at = 0
            else:
                break
            slate = by_id[sid]
            order, cells, size = slate.order, slate.group.cells, len(slate.order)
            if laid_out:
                before, rank, efficiency, weights, after = middles[sid]
                spread_of_slate = spread[slate.group] if before is None else (*before, spread[slate.group])
            else:
                efficiency, weights = middles[sid]
                spread_of_slate, rank, after = spread[slate.group], slate.group.rank, None
            bounded = False  # the limit below, worked out once the walk goes past the slate's first place
            limit = places = None  # places: the slate's group's power refusals in ``reads``
            while True:
                key, draw, added, step, out, _, _ = order[at]
                name = key[2]
                power = False
                reason = out  # what the first filters (ready, cordoned, held) would say, kept in the entry
                if reason is None:
                    indexed = nodes[name]
                    node = indexed.node
                    for reject in checks:  # the built-in filters, less those a candidate passes
                        reason = reject(node, placing)
                        if reason is not None:
                            break
                    if reason is None and others:  # the others, as plan_replica asks them, kept
                        reason = self._others_refusal(indexed, placing, others, verdict)
                    if reason is None:
                        # The first budgeted domain in level order that refuses, as plan_replica says it.
                        adds = added or 0.0
                        for cell in cells:
                            if cell.use + adds > cell.ceiling:
                                reason = cell.refusal(draw, adds)
                                if reason is not None:
                                    if places is None:  # worded again when their use moves
                                        group = slate.group
                                        places = reads.get(group)
                                        if places is None:
                                            places = reads[group] = {}
                                            _read(group, read)
                                    place = (slate, at, True)
                                    places[place] = None
                                    power = True
                                    break
                    if reason is None:
                        if trail:
                            end = ranking.key_at(*trail[-1][:2])
                        if replay.size:
                            reasons = dict(Counter(rejections.values()))
                        self._put_back(ranking, waiting, last)
                        # Where each walked slate goes on holds for the next plan once the whole replay was
                        # passed over again (else a replayed slate's last place is earlier than its entry).
                        return self._chosen(
                            ranking, slate, at, node, draw, step, rejections, reasons, trail, last,
                            frontier if played == replay.size else None, read, reads, exclude, end,
                        )
                rejections[name] = reason
                reasons[reason] = reasons.get(reason, 0) + 1
                trail.append(place if power else (slate, at, False))
                last[slate] = at
                at += 1
                if at == size:
                    break
                if not bounded:
                    # The first key of the other slates: this one's entries go first until one passes it (all
                    # of them, when it is of a later spread or rank). Stale heap entries only stop it early.
                    bounded = True
                    limit = frontier[0][0] if frontier else None
                    if heap and (limit is None or heap[0][:7] < limit):
                        limit = heap[0][:7]
                    if played < replay.size:
                        following = replay.key(played)
                        if limit is None or following < limit:
                            limit = following
                    if limit is not None and (limit[0], limit[1]) > (spread_of_slate, rank):
                        limit = None
                if limit is not None:
                    following = order[at][0]
                    following = (
                        spread_of_slate, rank, following[0], efficiency, weights,
                        following[1] if after is None else (following[1], *after), following[2],
                    )
                    if limit < following:  # its key_at: the frontier keeps it
                        heappush(frontier, (following, sid, at))
                        break
        # Nothing fits: no walk is kept; every slate walked goes back into the heap.
        self._put_back(ranking, waiting, last)
        bounds, versions = ranking.bounds, ranking.versions
        for slate in last:
            heappush(heap, (*bounds[slate.sid], slate.sid, versions[slate.sid]))
        return self._nofit(request, exclude)

    @staticmethod
    def _others_refusal(entry: _Entry, placing: Placing, others: Sequence, kind: int) -> str | None:
        """The first refusal of the filters not built in (before power, in the registry's order), kept by
        model and profile (``kind``: their number in the index) while what they read of the node stays; a
        failure's words are not kept."""
        verdicts = entry.verdicts
        if kind in verdicts:
            return verdicts[kind]
        node = entry.node
        for item in others:
            reason, failed = REGISTRY.verdict(item, node, placing)
            if failed:
                return reason
            if reason is not None:
                break
        verdicts[kind] = reason
        return reason

    @staticmethod
    def _put_back(ranking: _Ranking, waiting: set[_Slate], last: dict[_Slate, int]) -> None:
        """The replayed slates none of whose places came before the choice go back into the heap."""
        heap, bounds, versions = ranking.heap, ranking.bounds, ranking.versions
        for slate in waiting:
            if slate not in last:
                sid = slate.sid
                heappush(heap, (*bounds[sid], sid, versions[sid]))

    def _chosen(
        self, ranking: _Ranking, slate: _Slate, at: int, node: NodeView, draw: float | None, step: int,
        rejections: dict[str, str], reasons: dict[str, int], trail: list, last: dict, frontier: list | None,
        read: dict, reads: dict, exclude: frozenset[str], end: tuple | None,
    ) -> Plan:
        """The plan for the candidate at ``at`` of ``slate``; the walk that came before it kept. The slates
        walked stay off the heap with it (the next plan starts each after its last place); the chosen one,
        when nothing of it was passed over, goes back."""
        bounds, versions, heap = ranking.bounds, ranking.versions, ranking.heap
        if slate not in last:
            heappush(heap, (*bounds[slate.sid], slate.sid, versions[slate.sid]))
        if trail:
            if frontier is None:
                # The replay was cut short by the choice: the refusals it carried over that were not passed
                # over again are dropped (their slates are back in the heap, and may change there).
                reads = _passed(reads, last)
            elif slate in last:
                heappush(frontier, (ranking.key_at(slate, at), slate.sid, at))  # it goes on at the chosen one
            ranking.walk = _Walk(
                rejections, reasons, trail, last, frontier, ranking.shape.changes.mark(), self._uses.mark(), read,
                reads, exclude, end,
            )
        if len(heap) > 4 * len(versions) + 64:
            heap[:] = [e for e in heap if e[8] == versions[e[7]]]
            heapify(heap)
        group = slate.group
        placing = Placing(ranking.request, self._facility, counts=ranking.counts)
        placing.known(node, verdict=(None, group.rank, group.notes), draw=draw, step=step)
        return Plan(
            shards=(shard_for(node, ranking.request.profile, draw),),
            why=placing.why(node),
            rejections=rejections,  # the walk's too: a later plan copies it before adding
            notes=group.notes,
            reasons=reasons,  # likewise
        )

    def _nofit(self, request: ReplicaRequest, exclude: frozenset[str]) -> Plan | NoFit:
        """Nothing fits: every node's rejection, as ``plan_replica`` words it, read off the index."""
        profile = request.profile
        settings = self._facility.settings
        placing = Placing(request, self._facility, exclude=exclude)
        rejections: dict[str, str] = {}
        draws: dict[float | None, float | None] = {}
        for name in sorted(self._nodes):
            entry = self._nodes[name]
            node = entry.node
            placing.known(node, held=entry.held)
            reason = placing.rejection(node, before_power=True)  # power: the cells' words, below
            if reason is None:
                limit = node.gpu_power_limit_watts
                if limit not in draws:
                    draws[limit] = draw_of(node, profile, settings)
                added = added_of(node, draws[limit], settings)
                for cell in entry.group.cells:
                    reason = cell.refusal(draws[limit], added or 0.0)
                    if reason is not None:
                        break
            if reason is None:  # cannot happen once the candidates ran out; the plain path decides
                return plan_replica(request, self.nodes(), self._facility, exclude=exclude)
            rejections[name] = reason
        return NoFit(summary=nofit_summary(rejections), rejections=rejections)


@dataclass(frozen=True, slots=True)
class Headroom:
    """How many more replicas fit, and why the next does not (None when the count hit the limit)."""

    fits: int
    why_not: str | None


def headroom(
    request: ReplicaRequest,
    nodes: Sequence[NodeView],
    facility: FacilityView,
    *,
    limit: int = 1000,
) -> Headroom:
    """How many more replicas of the request fit: the same pipeline as a dry run on a copy."""
    index = PlacementIndex(nodes, facility)
    existing = list(request.existing)
    fits = 0
    while fits < limit:
        result = index.plan(dataclasses.replace(request, existing=tuple(existing)))
        if isinstance(result, NoFit):
            return Headroom(fits=fits, why_not=result.summary)
        index.apply(result)
        existing.append(result.nodes)
        fits += 1
    return Headroom(fits=fits, why_not=None)
