"""The planner: where a model's next replica goes, or why it goes nowhere.

Pure: no Django, no ORM, no clock, no randomness. The Django side builds the plain frozen views below
from one read of the store; the planner returns a :class:`Plan` (one shard per node) or a
:class:`NoFit` with every node's rejection. The guarded commit then re-checks against locked rows.

Every filter and scorer is an entry of the one registry (placement.plugins.REGISTRY), with one signature
(``reject(node, placing)``, ``key(node, placing)``, ``why(node, placing)``: :class:`Placing` is the plan's
question); the built-ins are defined and registered here, power last. The built-in filters, in the order
they are checked, each with its reason in words:

1. ``not ready``, ``cordoned``, ``rack r12-07 is held: PDU swap`` (the first held domain, level order),
   ``excluded (lost a race)``;
2. the profile's node_selector: ``needs gpu.model in (H100,H200)``;
3. resources: ``gpu: 8 requested, 3 free``, the profile's topology (``topology: no 4 free GPUs all joined
   by NVLink (free: 0,1,4,6)``), ``cpu: …``, ``memory: 256 GiB requested, 100 GiB free``;
4. for a multi-node replica: a fabric, the keep_within label, and a group with enough nodes;
5. power: ``rack r12-07: 14.2 kW of a 14.4 kW limit (16.0 kW cap less 10%) in use, 16.3 kW with the shard (~2.8 kW)``.

A node in a domain that is ``hot`` under ``enforce`` mode is refused as a hold would refuse it
(``rack r12-07 is hot (inlet 33.1 °C for 6 min, hot above 32 °C)``); under ``observe`` mode it is not,
and the plan notes ``would have refused: …`` instead.

What passes is ordered, never filtered, by the scorers' keys in their order (:meth:`Placing.key`): fewest of the model's replicas in the
node's racks and PDUs first (counted, so replicas stay even), then condition (ok before warm, under
enforce mode), then the power headroom left in the node's rack after the shard (more first, in coarse
steps of a tenth of the limit), then the model's measured tokens per joule on the node's GPU model
(more first), then nodes holding the weights, then bin packing, then the name; a scorer not built in
takes its place among them by its ``order``.

:func:`plan_replica` is the plain, whole-cluster evaluation; :class:`placement.index.PlacementIndex`
is the fast path for a long run of placements and gives the same plans.

Kept in one module: it is the reference every fast path is held equal to (the index by property
tests, the commit's re-check through :func:`recheck_rejection` and :func:`power_rejection_in`), so its
filters, its scorers and its power rule are read together, in the order they apply.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from facility.conditions import HOT, WARM
from facility.domains import LABEL_PREFIX, Domain
from facility.power import (
    Budget,
    FacilitySettings,
    node_use_added_watts,
    node_use_watts,
    power_refusal,
    shard_draw_watts,
    would_pass_limit,
)
from placement.plugins import LAST_FILTER, REGISTRY, Filter, Scorer
from placement.selector import Selector
from placement.topology import ANY, GpuTopology, gpus_pick, pick_words, refusal
from placement.topology import gpus_text as gpus_text  # ctl, the views and capping read it here

# The levels a model's replicas are spread across.
SPREAD_LEVELS = frozenset({"rack", "pdu"})
SUMMARY_GROUPS = 5
EPSILON_GIB = 1e-9
# The most replicas one node is given. An agent reports every replica it runs in each heartbeat, and a
# heartbeat listing more than the protocol's bound (agents.node.protocol.MAX_REPLICAS, 1,024) is refused:
# the node would stop being ready for good. Half of it: placers racing for the last places stay far below.
MAX_NODE_REPLICAS = 512
# Headroom is compared in steps of a tenth of the rack's limit, so bin packing still decides inside one.
HEADROOM_STEPS = 10
FULL_HEADROOM = HEADROOM_STEPS


@dataclass(frozen=True, slots=True)
class Profile:
    """What one replica of a model needs, per node, and where its nodes must be."""

    gpus: int
    nodes: int = 1
    cpu_cores: int = 0
    memory_gib: float = 0
    power_watts: float | None = None
    keep_within: str | None = None
    selector: Selector | None = None
    # Tokens per joule this model was measured at, per GPU model (``(("H100", 2.1), ("H200", 3.0))``):
    # among candidates otherwise equal up to the headroom step, the more efficient card goes first.
    tokens_per_joule: tuple[tuple[str, float], ...] = ()
    # How a shard's GPUs must be joined: any, nvlink-all or same-numa (placement.topology).
    topology: str = ANY


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node as the planner sees it: free resources, place, power, and what it already runs."""

    name: str
    ready: bool
    cordoned: bool
    labels: Mapping[str, str]
    domains: tuple[Domain, ...]
    fabric: str | None
    gpus_total: int
    free_gpus: tuple[int, ...]
    cpu_cores_total: int
    cpu_cores_free: int
    memory_gib_total: float
    memory_gib_free: float
    gpu_power_limit_watts: float | None = None
    placed_watts: float = 0.0
    measured_watts: float | None = None
    weights: frozenset[str] = frozenset()
    replicas: int = 0
    # How its GPUs are wired (placement.topology); None when it reports nothing: its links are unknown.
    gpu_topology: GpuTopology | None = None


@dataclass(frozen=True, slots=True)
class DomainCondition:
    """A domain's thermal condition as placement reads it: ok/warm/hot/unknown, enforced or observed.

    ``detail`` is the reading in words (``inlet 33.1 °C for 6 min, hot above 32 °C``).
    """

    condition: str
    enforce: bool = False
    detail: str = ""

    def words(self, domain: Domain) -> str:
        """``rack r12-07 is hot (inlet 33.1 °C for 6 min, hot above 32 °C)``."""
        text = f"{domain.label} is {self.condition}"
        return f"{text} ({self.detail})" if self.detail else text


@dataclass(frozen=True, slots=True)
class FacilityView:
    """The facility figures placement reads: settings, budgets by domain, holds (domain → reason),
    and the domains' thermal conditions (only those not ok or unknown need be listed)."""

    settings: FacilitySettings = field(default_factory=FacilitySettings)
    budgets: Mapping[Domain, Budget] = field(default_factory=dict)
    holds: Mapping[Domain, str] = field(default_factory=dict)
    conditions: Mapping[Domain, DomainCondition] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ReplicaRequest:
    """One replica to place: its model, profile, and the node names of each existing replica."""

    model: str
    profile: Profile
    existing: tuple[frozenset[str], ...] = ()


@dataclass(frozen=True, slots=True)
class ShardPlan:
    """One node's part of a replica: the cards (placement.topology's pick), cores, memory and draw."""

    node: str
    gpu_indices: tuple[int, ...]
    cpu_cores: int
    memory_gib: float
    draw_watts: float | None


@dataclass(frozen=True)
class Plan:
    """Where a replica goes, why there, and why not on the nodes ranked ahead of it."""

    shards: tuple[ShardPlan, ...]
    why: str
    rejections: dict[str, str]
    # What observe mode would have done differently on the chosen nodes: "would have refused: …".
    notes: tuple[str, ...] = ()
    # How many rejections give each reason, where the planner counted them as it went (the index: a
    # lost room's plans each pass its 2,500 held nodes over); None: counted from ``rejections``.
    reasons: Mapping[str, int] | None = field(default=None, compare=False, repr=False)

    @property
    def nodes(self) -> frozenset[str]:
        """The node names of the replica, as ``ReplicaRequest.existing`` takes them."""
        return frozenset(s.node for s in self.shards)


@dataclass(frozen=True)
class NoFit:
    """No node fits: the summary (most common reasons first) and every node's rejection."""

    summary: str
    rejections: dict[str, str]


# --- pieces the plain path and the index share, so the two cannot disagree ---------------------------


def spread_counts(
    existing: Iterable[frozenset[str]], nodes_by_name: Mapping[str, NodeView]
) -> dict[Domain, int]:
    """How many of the model's replicas run in each rack and PDU (nodes no longer known are skipped).

    A replica counts once per domain however many of its nodes sit there.
    """
    counts: dict[Domain, int] = {}
    for replica in existing:
        domains: set[Domain] = set()
        for name in replica:
            node = nodes_by_name.get(name)
            if node is not None:
                domains.update(d for d in node.domains if d.level in SPREAD_LEVELS)
        for domain in domains:
            counts[domain] = counts.get(domain, 0) + 1
    return counts


def spread_of(domains: Iterable[Domain], counts: Mapping[Domain, int]) -> int:
    """The replicas already in a node's racks and PDUs, summed: fewer first (the skew stays small)."""
    if not counts:
        return 0
    return sum(counts.get(d, 0) for d in domains if d.level in SPREAD_LEVELS)


def condition_verdict(
    domains: Iterable[Domain], conditions: Mapping[Domain, DomainCondition]
) -> tuple[str | None, int, tuple[str, ...]]:
    """What the node's domains' conditions do to a placement: (refusal, rank, observe-mode notes).

    The refusal is the first domain (level order) hot under enforce mode; the rank is 1 when a domain
    is warm (or hot) under enforce mode, else 0 (ok and unknown place alike); under observe mode the
    notes say what enforcement would have done, and nothing else changes.
    """
    if not conditions:
        return None, 0, ()
    refusal: str | None = None
    rank = 0
    would_refuse: str | None = None
    would_score: str | None = None
    for domain in domains:
        state = conditions.get(domain)
        if state is None or state.condition not in (HOT, WARM):
            continue
        words = state.words(domain)
        if state.enforce:
            rank = 1
            if state.condition == HOT and refusal is None:
                refusal = words
        elif state.condition == HOT:
            would_refuse = would_refuse or words
        else:
            would_score = would_score or words
    notes: list[str] = []
    if would_refuse and refusal is None:
        notes.append(f"would have refused: {would_refuse}")
    if would_score and rank == 0:
        notes.append(f"would have scored down: {would_score}")
    return refusal, rank, tuple(notes)


def added_of(node: NodeView, draw: float | None, settings: FacilitySettings) -> float | None:
    """What the shard adds to each of the node's domains' use (None when its draw is unknown)."""
    return None if draw is None else node_use_added_watts(node.placed_watts, node.measured_watts, draw, settings)


def headroom_step(
    domains: Iterable[Domain], added: float | None, facility: FacilityView, use: Mapping[Domain, float]
) -> int:
    """Tenths of the node's rack limit left free after the shard (0 to 10); 10 without a rack budget.

    ``added`` is what the shard adds to the rack's use (:func:`added_of`). A shard of unknown draw
    leaves nothing to compare, so it counts as full: missing data changes no order.
    """
    if added is None or not facility.budgets:
        return FULL_HEADROOM
    for domain in domains:
        if domain.level != "rack":
            continue
        budget = facility.budgets.get(domain)
        if budget is None:
            continue
        return step_left(budget.limit_watts(facility.settings.margin), use.get(domain, budget.other_watts), added)
    return FULL_HEADROOM


def step_left(limit: float, use: float, added: float) -> int:
    """Tenths of a rack's ``limit`` left free once ``added`` joins its ``use`` (0 to 10)."""
    if limit <= 0:
        return 0
    left = limit - use - added
    # The epsilon keeps a running sum (the index's) and a fresh one (the plain path's) in one step.
    return max(0, min(HEADROOM_STEPS, math.floor(left * HEADROOM_STEPS / limit + 1e-9)))


def pack_value(node: NodeView, profile: Profile) -> int:
    """Bin packing: GPUs left free after the shard (GPU profiles), or replicas on it (CPU profiles)."""
    if profile.gpus > 0:
        return len(node.free_gpus) - profile.gpus
    return node.replicas


def efficiency_step(node: NodeView, profile: Profile) -> int:
    """The model's measured tokens per joule on the node's GPU model, in hundredths (0: not measured), so
    noise in the figures does not reorder cards that serve alike."""
    return efficiency_of(node.labels.get("gpu.model"), profile)


def efficiency_of(gpu_model: str | None, profile: Profile) -> int:
    """efficiency_step for a node of this GPU model (its ``gpu.model`` label)."""
    if not profile.tokens_per_joule:
        return 0
    for name, value in profile.tokens_per_joule:
        if name == gpu_model:
            return int(value * 100)
    return 0


def has_cards_for(node: NodeView, profile: Profile) -> bool:
    """True when the node has the free cards a shard asks for (else it is no candidate at all)."""
    return len(node.free_gpus) >= profile.gpus


def _amount(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def held_reason(node: NodeView, holds: Mapping[Domain, str]) -> str | None:
    """``rack r12-07 is held: PDU swap`` for the node's first held domain (level order), else None."""
    if holds:
        for domain in node.domains:
            reason = holds.get(domain)
            if reason is not None:
                return f"{domain.label} is held: {reason}" if reason else f"{domain.label} is held"
    return None


def unavailable_reason(node: NodeView, held: str | None) -> str | None:
    """Why the node takes no shard whatever is asked (not ready, cordoned, held), or None: the first of the
    filters, which move only with the node or the facility."""
    if not node.ready:
        return "not ready"
    if node.cordoned:
        return "cordoned"
    return held


def blocked_reason(node: NodeView, facility: FacilityView) -> str | None:
    """A hold on one of the node's domains, else an enforced hot condition: what refuses it as a hold."""
    return held_reason(node, facility.holds) or condition_verdict(node.domains, facility.conditions)[0]


# --- the plan's question, as every rule reads it -----------------------------------------------------

_UNSET: Any = object()


class Placing:
    """One plan's question, as every filter and scorer reads it (the Kubernetes framework's cycle state):
    the request (``model``, ``profile``, ``existing``), the facility, the nodes this replica lost a race
    for (``exclude``), the model's replicas in each rack and PDU (``counts``) and the budgeted domains' use
    (``use``), worked out once a plan; and, once a node, its hold, condition verdict, the shard's draw and
    the headroom step it leaves (kept for the node asked last: a plan asks its filters, then its scorers,
    of one node after another). A path that knows some of them already (the index) gives them
    (:meth:`known`)."""

    __slots__ = (
        "request", "model", "profile", "existing", "facility", "exclude", "counts", "use", "_filters", "_scorers",
        "_checks", "_keys", "_node", "_held", "_verdict", "_draw", "_step",
    )

    def __init__(
        self,
        request: ReplicaRequest,
        facility: FacilityView,
        *,
        exclude: frozenset[str] = frozenset(),
        counts: Mapping[Domain, int] | None = None,
        use: Mapping[Domain, float] | None = None,
    ) -> None:
        self.request = request
        self.model = request.model
        self.profile = request.profile
        self.existing = request.existing
        self.facility = facility
        self.exclude = exclude
        self.counts = {} if counts is None else counts
        self.use = {} if use is None else use
        # The rules as registered when the plan began (a plugin loaded meanwhile waits for the next plan).
        self._filters = tuple(REGISTRY.filters)
        self._scorers = tuple(REGISTRY.scorers)
        self._checks: tuple | None = None  # the filters as rejection calls them, made when first asked
        self._keys: tuple | None = None  # the scorers as key calls them, likewise
        self._node: NodeView | None = None

    def _at(self, node: NodeView) -> None:
        if self._node is not node:
            self._node = node
            self._held = self._verdict = self._draw = self._step = _UNSET

    def known(
        self, node: NodeView, *, held: Any = _UNSET, verdict: Any = _UNSET, draw: Any = _UNSET, step: Any = _UNSET
    ) -> None:
        """What the caller knows of the node already (the index keeps holds, verdicts, draws and steps)."""
        self._at(node)
        if held is not _UNSET:
            self._held = held
        if verdict is not _UNSET:
            self._verdict = verdict
        if draw is not _UNSET:
            self._draw = draw
        if step is not _UNSET:
            self._step = step

    def verdict(self, node: NodeView) -> tuple[str | None, int, tuple[str, ...]]:
        """The node's domains' condition verdict: (refusal, rank, observe-mode notes)."""
        self._at(node)
        if self._verdict is _UNSET:
            self._verdict = condition_verdict(node.domains, self.facility.conditions)
        return self._verdict

    def held(self, node: NodeView) -> str | None:
        """A hold on one of the node's domains, else an enforced hot condition, in words; else None."""
        self._at(node)
        if self._held is _UNSET:
            self._held = held_reason(node, self.facility.holds) or self.verdict(node)[0]
        return self._held

    def draw(self, node: NodeView) -> float | None:
        """The shard's estimated draw on the node (None when nobody knows it)."""
        self._at(node)
        if self._draw is _UNSET:
            self._draw = draw_of(node, self.profile, self.facility.settings)
        return self._draw

    def step(self, node: NodeView) -> int:
        """Tenths of the node's rack limit left free after the shard (headroom_step)."""
        self._at(node)
        if self._step is _UNSET:
            added = added_of(node, self.draw(node), self.facility.settings)
            self._step = headroom_step(node.domains, added, self.facility, self.use)
        return self._step

    def spread(self, node: NodeView) -> int:
        """The model's replicas already in the node's racks and PDUs, summed."""
        return spread_of(node.domains, self.counts)

    def rejection(self, node: NodeView, *, before_power: bool = False) -> str | None:
        """The first registered filter that turns the node down, in its words; None when all pass. A filter
        not built in is asked through the registry (fail closed: placement.plugins)."""
        checks = self._checks
        if checks is None:
            # Each filter as one call (a filter not built in through the registry), all and before power.
            calls = [item.reject if item.builtin else functools.partial(REGISTRY.refusal, item) for item in self._filters]
            before = len(calls) - 1 if self._filters and self._filters[-1].id == LAST_FILTER else len(calls)
            checks = self._checks = (tuple(calls), tuple(calls[:before]))
        for reject in checks[1] if before_power else checks[0]:
            reason = reject(node, self)
            if reason is not None:
                return reason
        return None

    def key(self, node: NodeView) -> tuple:
        """The node's ranking key: each registered scorer's key in order, then the name (smaller first). A
        scorer not built in is asked through the registry (0 where it fails: neutral)."""
        keys = self._keys
        if keys is None:
            keys = self._keys = tuple(
                item.key if item.builtin else functools.partial(REGISTRY.score, item) for item in self._scorers
            )
        return (*[key(node, self) for key in keys], node.name)

    def why(self, node: NodeView) -> str:
        """The ordering keys that decided for the node, in words: the built-in scorers' in order, then each
        other scorer's, naming it."""
        parts: list[str] = []
        for item in self._scorers:
            if item.builtin and item.why is not None:
                words = item.why(node, self)
                if words:
                    parts.append(words)
        parts += REGISTRY.whys([s for s in self._scorers if not s.builtin], node, self)
        return "; ".join(parts)


# --- the built-in filters: (node, placing) → the refusal's words, or None ------------------------------


def _ready(node: NodeView, placing: Placing) -> str | None:
    return None if node.ready else "not ready"


def _cordoned(node: NodeView, placing: Placing) -> str | None:
    return "cordoned" if node.cordoned else None


def _held(node: NodeView, placing: Placing) -> str | None:
    return placing.held(node)


def _excluded(node: NodeView, placing: Placing) -> str | None:
    return "excluded (lost a race)" if node.name in placing.exclude else None


def _selector(node: NodeView, placing: Placing) -> str | None:
    selector = placing.profile.selector
    if selector is not None:
        unmet = selector.first_unmet(node.labels)
        if unmet is not None:
            return f"needs {unmet}"
    return None


def _gpus(node: NodeView, placing: Placing) -> str | None:
    profile = placing.profile
    if profile.gpus > 0 and len(node.free_gpus) < profile.gpus:
        return f"gpu: {profile.gpus} requested, {len(node.free_gpus)} free"
    return None


def _topology(node: NodeView, placing: Placing) -> str | None:
    profile = placing.profile
    if profile.topology == ANY or profile.gpus < 2 or len(node.free_gpus) < profile.gpus:
        return None
    if gpus_pick(node.free_gpus, profile.gpus, node.gpu_topology, profile.topology) is not None:
        return None
    return refusal(profile.topology, profile.gpus, node.free_gpus, node.gpu_topology)


def _cpus(node: NodeView, placing: Placing) -> str | None:
    profile = placing.profile
    if profile.cpu_cores > 0 and profile.cpu_cores > node.cpu_cores_free:
        return f"cpu: {profile.cpu_cores} requested, {node.cpu_cores_free} free"
    return None


def _memory(node: NodeView, placing: Placing) -> str | None:
    profile = placing.profile
    if profile.memory_gib > 0 and profile.memory_gib > node.memory_gib_free + EPSILON_GIB:
        return f"memory: {_amount(profile.memory_gib)} GiB requested, {_amount(node.memory_gib_free)} GiB free"
    return None


def _replicas(node: NodeView, placing: Placing) -> str | None:
    if node.replicas >= MAX_NODE_REPLICAS:
        return f"replicas: {node.replicas} on the node, the most one node runs"
    return None


def _fabric(node: NodeView, placing: Placing) -> str | None:
    profile = placing.profile
    if profile.nodes > 1:
        if not node.fabric:
            return f"no fabric (a {profile.nodes}-node replica stays inside one)"
        if profile.keep_within and not node.labels.get(LABEL_PREFIX + profile.keep_within):
            return f"no {LABEL_PREFIX}{profile.keep_within} label (keep_within: {profile.keep_within})"
    return None


def _power(node: NodeView, placing: Placing) -> str | None:
    return power_rejection(node, placing.draw(node), placing.facility, placing.use)


def _never(profile: Profile, exclude: frozenset[str]) -> bool:
    return False


# The built-in filters, in the order they are checked; power is last (a loaded filter goes before it).
# ``asks``: whether it can turn down one of the index's candidates (ready, not cordoned, not held, with
# the cards free) for the profile: the index asks only those.
BUILTIN_FILTERS = (
    Filter("ready", _ready, "a node whose heartbeats stopped takes nothing", builtin=True,
           reads=frozenset({"ready"}), asks=_never),
    Filter("cordoned", _cordoned, "a cordoned node takes nothing new", builtin=True,
           reads=frozenset({"cordoned"}), asks=_never),
    Filter("held", _held, "a held domain (or a hot one under enforce) takes nothing new", builtin=True,
           reads=frozenset({"domains"}), asks=_never),
    Filter("excluded", _excluded, "a node this replica lost a race for is not tried again", builtin=True,
           rechecked=False, reads=frozenset({"name"}), asks=lambda profile, exclude: bool(exclude)),
    Filter("selector", _selector, "the profile's node_selector", builtin=True, reads=frozenset({"labels"}),
           asks=lambda profile, exclude: profile.selector is not None),
    Filter("gpu", _gpus, "free GPUs", builtin=True, rechecked=False, reads=frozenset({"free_gpus"}), asks=_never),
    Filter("topology", _topology, "free GPUs joined as the profile's topology asks (nvlink-all, same-numa)",
           builtin=True, rechecked=False, reads=frozenset({"free_gpus", "gpu_topology"}),
           asks=lambda profile, exclude: profile.topology != ANY and profile.gpus >= 2),
    Filter("cpu", _cpus, "free cores", builtin=True, rechecked=False, reads=frozenset({"cpu_cores_free"}),
           asks=lambda profile, exclude: profile.cpu_cores > 0),
    Filter("memory", _memory, "free memory", builtin=True, rechecked=False, reads=frozenset({"memory_gib_free"}),
           asks=lambda profile, exclude: profile.memory_gib > 0),
    Filter("replicas", _replicas, f"at most {MAX_NODE_REPLICAS} replicas on one node (its heartbeat reports each)",
           builtin=True, rechecked=False, reads=frozenset({"replicas"})),
    Filter("fabric", _fabric, "a multi-node replica stays in one fabric and keep_within domain", builtin=True,
           reads=frozenset({"fabric", "labels"}), asks=lambda profile, exclude: profile.nodes > 1),
    # The commit re-checks power its own way: with the batch's other shards counted (power_rejection_in).
    Filter(LAST_FILTER, _power, "no budgeted domain (rack, PDU, leg, row, room, site) past its limit", builtin=True,
           rechecked=False, reads=frozenset({"domains", "placed_watts", "measured_watts", "gpu_power_limit_watts"}),
           asks=_never),
)


# --- the built-in scorers: (node, placing) → a key (smaller first), and their words ------------------


def _spread_key(node: NodeView, placing: Placing) -> int:
    return placing.spread(node)


def _spread_why(node: NodeView, placing: Placing) -> str | None:
    replicas = len(placing.existing)
    if not replicas:
        return None
    counts = placing.counts
    shared = [(d, counts[d]) for d in node.domains if counts.get(d)]
    them = f"the model's {_plural(replicas, 'replica')}"
    if shared:
        # "rack r1 (2)": how many of the replicas are there, when it is more than one.
        names = ", ".join(d.label + (f" ({n})" if n > 1 else "") for d, n in shared)
        return f"shares {names} with {them}, the fewest of the nodes that fit"
    return f"shares no rack or pdu with {them}"


def _condition_key(node: NodeView, placing: Placing) -> int:
    return placing.verdict(node)[1]


def _condition_why(node: NodeView, placing: Placing) -> str | None:
    return "warm, and no ok node fits" if placing.verdict(node)[1] else None


def _headroom_key(node: NodeView, placing: Placing) -> int:
    return -placing.step(node)


def _headroom_why(node: NodeView, placing: Placing) -> str | None:
    step = placing.step(node)
    return f"leaves {step * 100 // HEADROOM_STEPS} % of its rack's limit free or more" if step < FULL_HEADROOM else None


def _efficiency_key(node: NodeView, placing: Placing) -> int:
    return -efficiency_step(node, placing.profile)


def _efficiency_why(node: NodeView, placing: Placing) -> str | None:
    efficiency = efficiency_step(node, placing.profile)
    return f"serves {efficiency / 100:g} tokens/J on {node.labels.get('gpu.model')}" if efficiency else None


def _weights_key(node: NodeView, placing: Placing) -> int:
    return 0 if placing.model in node.weights else 1


def _weights_why(node: NodeView, placing: Placing) -> str | None:
    return "holds the weights" if placing.model in node.weights else None


def _pack_key(node: NodeView, placing: Placing) -> int:
    return pack_value(node, placing.profile)


def _pack_why(node: NodeView, placing: Placing) -> str | None:
    profile = placing.profile
    if profile.gpus <= 0:
        return f"runs {_plural(node.replicas, 'replica')} already"
    words = f"leaves {_plural(len(node.free_gpus) - profile.gpus, 'GPU')} free"
    if node.gpu_topology is not None and profile.gpus > 1:
        joined = pick_words(node.gpu_topology, gpus_for(node, profile))
        if joined:
            words += f"; {joined}"
    return words


# The built-in scorers, in the order their keys rank; a scorer not built in takes its place among them by
# its ``order``, and the node's name comes last.
BUILTIN_SCORERS = (
    Scorer("spread", _spread_key, _spread_why, 10, "fewest of the model's replicas in the node's racks and PDUs",
           builtin=True, reads=frozenset({"domains"})),
    Scorer("condition", _condition_key, _condition_why, 20, "ok before warm (under enforce mode)", builtin=True,
           reads=frozenset({"domains"})),
    Scorer("headroom", _headroom_key, _headroom_why, 30, "more of the rack's power limit left after the shard, in "
           "tenths", builtin=True, reads=frozenset({"domains", "placed_watts", "measured_watts",
                                                    "gpu_power_limit_watts"})),
    Scorer("tokens-per-joule", _efficiency_key, _efficiency_why, 40,
           "the model's measured tokens per joule on the node's GPU model", builtin=True, reads=frozenset({"labels"})),
    Scorer("weights", _weights_key, _weights_why, 50, "nodes that hold the model's weights", builtin=True,
           reads=frozenset({"weights"})),
    Scorer("pack", _pack_key, _pack_why, 60, "bin packing: fewest GPUs left free", builtin=True,
           reads=frozenset({"free_gpus", "replicas"})),
)


# --- what the index reads of the registry ------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _inputs_of(fields: frozenset[str]) -> Callable[[NodeView], tuple]:
    ordered = sorted(fields)
    if len(ordered) > 1:
        return attrgetter(*ordered)
    # A tuple whatever the count: one compared by its items, an unchanged field found by identity.
    return (lambda node: (getattr(node, ordered[0]),)) if ordered else (lambda node: ())


def filter_inputs(node: NodeView) -> tuple:
    """What of a node the registered filters before power read (their ``reads``): a rejection the index
    kept from an earlier plan holds while this stays the same."""
    return _inputs_of(REGISTRY.reads_of("filters"))(node)


def rule_inputs(node: NodeView, kind: str) -> tuple:
    """What of a node the filters or scorers not built in read (``kind``: "other filters", "other
    scorers"): their verdicts and keys the index kept hold while this stays."""
    return _inputs_of(REGISTRY.reads_of(kind))(node)


def candidate_filters(profile: Profile, exclude: frozenset[str]) -> tuple[Callable[[NodeView, Placing], str | None], ...]:
    """The built-in filters before power, in order, that can turn down a node known to be ready, not
    cordoned, not held and with the cards the profile asks free (the index's candidates): each of the
    others passes such a node whatever else it is (its ``asks``), so the first refusal is the same."""
    return tuple(
        item.reject
        for item in REGISTRY.filters
        if item.builtin and item.id != LAST_FILTER and (item.asks is None or item.asks(profile, exclude))
    )


def recheck_rejection(node: NodeView, placing: Placing) -> str | None:
    """Why a chosen node, as its locked row has it now, turns the replica down, or None: every registered
    filter that is ``rechecked`` (readiness, cordon, holds, the selector and fabric on its labels now, the
    filters not built in), in the registry's order and through the same functions; the guarded commit's
    re-check. Resources are the guarded writes' to keep, power :func:`power_rejection_in`'s."""
    for item in REGISTRY.filters:
        if item.rechecked:
            reason = item.reject(node, placing) if item.builtin else REGISTRY.refusal(item, node, placing)
            if reason is not None:
                return reason
    return None


def draw_of(node: NodeView, profile: Profile, settings: FacilitySettings) -> float | None:
    """The shard's estimated draw on this node (None when nobody knows it)."""
    return shard_draw_watts(
        gpus=profile.gpus,
        cpu_cores=profile.cpu_cores,
        nodes=profile.nodes,
        power_watts=profile.power_watts,
        node_gpu_power_limit_watts=node.gpu_power_limit_watts,
        settings=settings,
    )


def power_rejection(
    node: NodeView,
    draw: float | None,
    facility: FacilityView,
    use: Mapping[Domain, float],
    *,
    pending: Mapping[Domain, tuple[float, float]] | None = None,
) -> str | None:
    """The first budgeted domain (level order) whose use after the shard would pass its limit, in words.

    ``pending`` holds, per domain, what the shards of the same replica already chosen there add to its
    use and their draw: a multi-node replica is counted whole.
    """
    budgets = facility.budgets
    if not budgets:
        return None
    return power_rejection_in(
        [
            (budgets[d], use.get(d, budgets[d].other_watts), *(pending.get(d, (0.0, 0.0)) if pending else (0.0, 0.0)))
            for d in node.domains
            if d in budgets
        ],
        draw,
        node_use_added_watts(node.placed_watts, node.measured_watts, draw, facility.settings),
        facility.settings.margin,
    )


def power_rejection_in(
    domains: Iterable[tuple[Budget, float, float, float]], draw: float | None, added: float, margin: float
) -> str | None:
    """The refusal for the first domain whose use after the shard passes its limit, or None.

    Each domain comes as (budget, use before the replica, what the replica's other shards there add
    to it, their draw); ``added`` is what this shard adds (:func:`facility.power.node_use_added_watts`).
    """
    for budget, before, taken_added, taken_draw in domains:
        after = before + taken_added + added
        if would_pass_limit(after, budget.limit_watts(margin)):
            return power_refusal(
                budget,
                use_watts=before,
                after_watts=after,
                draw_watts=taken_draw + (draw or 0),
                margin=margin,
                combined=bool(taken_draw),
            )
    return None


def domain_uses(nodes: Iterable[NodeView], facility: FacilityView) -> dict[Domain, float]:
    """Each budgeted domain's use, from every node in it (ready or not: they all draw).

    Summed exactly (math.fsum: whatever the order, the nearest float to the true sum), so a use kept up
    to date node by node (the index's) words a refusal alike: a shard's use after it is often a round
    figure (a node's measured draw cancels out), and a sum off by its last bit could round its 0.1 kW
    the other way.
    """
    budgets = facility.budgets
    if not budgets:
        return {}
    terms: dict[Domain, list[float]] = {domain: [budget.other_watts] for domain, budget in budgets.items()}
    settings = facility.settings
    for node in nodes:
        term = None
        for domain in node.domains:
            if domain in terms:
                if term is None:
                    term = node_use_watts(node.placed_watts, node.measured_watts, settings)
                terms[domain].append(term)
    return {domain: math.fsum(values) for domain, values in terms.items()}


def shard_for(node: NodeView, profile: Profile, draw: float | None) -> ShardPlan:
    """The shard a node takes: the free GPUs best joined (placement.topology), the profile's cores and
    memory."""
    return ShardPlan(
        node=node.name,
        gpu_indices=gpus_for(node, profile),
        cpu_cores=profile.cpu_cores,
        memory_gib=profile.memory_gib,
        draw_watts=draw,
    )


def gpus_for(node: NodeView, profile: Profile) -> tuple[int, ...]:
    """The GPUs a shard of the profile takes on the node (placement.topology's pick)."""
    picked = gpus_pick(node.free_gpus, profile.gpus, node.gpu_topology, profile.topology)
    if picked is None:  # the topology filter turned such a node down; the best set there is, else
        picked = gpus_pick(node.free_gpus, profile.gpus, node.gpu_topology) or ()
    return picked


def apply_shard(node: NodeView, shard: ShardPlan) -> NodeView:
    """The node as it is once the shard is placed on it (for dry runs and the index)."""
    taken = set(shard.gpu_indices)
    # dataclasses.replace, spelt out (a test holds the two equal): a placement's own cost in the index.
    return NodeView(
        name=node.name,
        ready=node.ready,
        cordoned=node.cordoned,
        labels=node.labels,
        domains=node.domains,
        fabric=node.fabric,
        gpus_total=node.gpus_total,
        free_gpus=tuple(i for i in node.free_gpus if i not in taken),
        cpu_cores_total=node.cpu_cores_total,
        cpu_cores_free=node.cpu_cores_free - shard.cpu_cores,
        memory_gib_total=node.memory_gib_total,
        memory_gib_free=node.memory_gib_free - shard.memory_gib,
        gpu_power_limit_watts=node.gpu_power_limit_watts,
        placed_watts=node.placed_watts + (shard.draw_watts or 0),
        measured_watts=node.measured_watts,
        weights=node.weights,
        replicas=node.replicas + 1,
        gpu_topology=node.gpu_topology,
    )


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"



def reasons_grouped(rejections: Mapping[str, str], counts: Mapping[str, int] | None = None) -> str:
    """``7 × gpu: 8 requested, 0 free; 3 × …``: the most frequent reasons first, at most five groups, and
    how many more nodes were turned down for how many other reasons (each rack's power refusal has its own
    figures, so racks are what the five leave out). ``counts``: each reason's count, where already known
    (they are the rejections', counted)."""
    if counts is None:
        counts = Counter(rejections.values())
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    text = "; ".join(f"{count} × {reason}" for reason, count in ordered[:SUMMARY_GROUPS])
    rest = ordered[SUMMARY_GROUPS:]
    if rest:
        nodes = sum(count for _, count in rest)
        text += f"; {_plural(nodes, 'more node')} for {_plural(len(rest), 'other reason')}"
    return text


def nofit_summary(rejections: Mapping[str, str]) -> str:
    """``no node fits (12 nodes): 7 × gpu: 8 requested, 0 free; 3 × …`` (at most five groups)."""
    if not rejections:
        return "no nodes"
    return f"no node fits ({_plural(len(rejections), 'node')}): {reasons_grouped(rejections)}"


def ahead_rejections(ranked: Iterable[tuple[tuple, str, str]], chosen_key: tuple) -> dict[str, str]:
    """The rejections of candidates (nodes with the cards free) ranked ahead of the chosen node."""
    return {name: reason for key, name, reason in sorted(ranked) if key < chosen_key}


# --- the plain path --------------------------------------------------------------------------------


def why_text(node: NodeView, placing: Placing) -> str:
    """The ordering keys that decided for this node, in words (each scorer's, Placing.why)."""
    return placing.why(node)


def plan_replica(
    request: ReplicaRequest,
    nodes: Sequence[NodeView],
    facility: FacilityView,
    *,
    exclude: frozenset[str] = frozenset(),
) -> Plan | NoFit:
    """Plan one replica over the whole cluster: every node is asked every registered filter and scorer,
    then the best is taken.

    A plan keeps the rejections of the nodes that had the cards free and ranked ahead of the
    chosen one; a no-fit keeps every node's.
    """
    if not nodes:
        return NoFit(summary="no nodes", rejections={})
    by_name = {node.name: node for node in nodes}
    placing = Placing(
        request, facility, exclude=exclude, counts=spread_counts(request.existing, by_name),
        use=domain_uses(nodes, facility),
    )
    if request.profile.nodes > 1:
        return _plan_multi(placing, nodes)
    profile = request.profile
    rejections: dict[str, str] = {}
    ranked: list[tuple[tuple, str, str]] = []
    best: tuple[tuple, NodeView] | None = None
    for node in nodes:
        reason = placing.rejection(node)
        if reason is not None:
            rejections[node.name] = reason
            if has_cards_for(node, profile):  # ranked only where its cards were free (ahead_rejections)
                ranked.append((placing.key(node), node.name, reason))
            continue
        key = placing.key(node)
        if best is None or key < best[0]:
            best = (key, node)
    if best is None:
        ordered = dict(sorted(rejections.items()))
        return NoFit(summary=nofit_summary(ordered), rejections=ordered)
    key, node = best
    return Plan(
        shards=(shard_for(node, profile, placing.draw(node)),),
        why=placing.why(node),
        rejections=ahead_rejections(ranked, key),
        notes=placing.verdict(node)[2],
    )


def _plan_multi(placing: Placing, nodes: Sequence[NodeView]) -> Plan | NoFit:
    """A replica of several nodes: all in one fabric (and one keep_within domain), counted whole.

    Its nodes are ordered as single nodes are (spreading by count first), so groups whose racks hold
    fewer of the model's replicas win: multi-node replicas spread across racks too.
    """
    profile, facility, use = placing.profile, placing.facility, placing.use
    wanted = profile.nodes
    level = profile.keep_within
    too_few = f"no {level or 'fabric'} with {wanted} nodes that fit"
    rejections: dict[str, str] = {}
    keys: dict[str, tuple] = {}
    groups: dict[tuple[str, str], list[NodeView]] = {}
    for node in nodes:
        keys[node.name] = placing.key(node)
        # Power is judged below, with the replica's other shards in the group counted.
        reason = placing.rejection(node, before_power=True)
        if reason is not None:
            rejections[node.name] = reason
            continue
        place = node.labels.get(LABEL_PREFIX + level, "") if level else ""
        groups.setdefault((node.fabric or "", place), []).append(node)

    best: tuple[tuple, list[tuple[NodeView, float | None]]] | None = None
    for group_key in sorted(groups):
        members = groups[group_key]
        if len(members) < wanted:
            for node in members:
                rejections[node.name] = too_few
            continue
        chosen: list[tuple[NodeView, float | None]] = []
        pending: dict[Domain, tuple[float, float]] = {}
        for node in sorted(members, key=lambda n: keys[n.name]):
            draw = placing.draw(node)
            alone = power_rejection(node, draw, facility, use)
            if alone is not None:
                rejections[node.name] = alone
                continue
            if len(chosen) == wanted:
                continue
            together = power_rejection(node, draw, facility, use, pending=pending)
            if together is not None:
                rejections[node.name] = together
                continue
            chosen.append((node, draw))
            added = node_use_added_watts(node.placed_watts, node.measured_watts, draw, facility.settings)
            for domain in node.domains:
                if domain in facility.budgets:
                    taken_added, taken_draw = pending.get(domain, (0.0, 0.0))
                    pending[domain] = (taken_added + added, taken_draw + (draw or 0))
        if len(chosen) < wanted:
            for node, _ in chosen:
                rejections[node.name] = too_few
            continue
        rank = (tuple(keys[node.name] for node, _ in chosen), group_key)
        if best is None or rank < best[0]:
            best = (rank, chosen)

    if best is None:
        ordered = dict(sorted(rejections.items()))
        return NoFit(summary=nofit_summary(ordered), rejections=ordered)
    (chosen_keys, (fabric, place)), chosen = best
    by_name = {node.name: node for node in nodes}
    ranked = [
        (keys[name], name, reason)
        for name, reason in rejections.items()
        if has_cards_for(by_name[name], profile)
    ]
    where = f"fabric {fabric}" + (f" and {level} {place}" if level else "")
    first = chosen[0][0]
    notes = tuple(dict.fromkeys(note for node, _ in chosen for note in placing.verdict(node)[2]))
    return Plan(
        shards=tuple(shard_for(node, profile, draw) for node, draw in chosen),
        why=f"{wanted} nodes in {where}; {first.name}: " + placing.why(first),
        rejections=ahead_rejections(ranked, chosen_keys[-1]),
        notes=notes,
    )


# -- words for people (ctl and the console print them; pure, so a remote ctl needs no Django) --


def _plural_of(count: int | float, word: str) -> str:
    return f"{count:g} {word}" if count == 1 else f"{count:g} {word}s"


def efficiency_text(rows: list[dict[str, Any]], *, short: bool = False) -> str:
    """``H200 3.10 tok/J 2,400 tok/s · H100 2.20 tok/J 1,900 tok/s`` (best first), or ``-`` when not measured;
    ``short``: the tokens per joule alone (``H200 3.10 · H100 2.20``)."""
    if not rows:
        return "-"
    if short:
        return " · ".join(f"{r['gpu_model']} {r['tokens_per_joule']:.2f}" for r in rows)
    return " · ".join(
        f"{r['gpu_model']} {r['tokens_per_joule']:.2f} tok/J {r['tokens_per_second']:,.0f} tok/s" for r in rows
    )


def profile_text(profile: dict[str, Any]) -> str:
    """``8 GPUs × 2 nodes, 16 cores, 256 GiB, 6.0 kW; keep_within rack; gpu.model in (H100,H200); topology
    nvlink-all``."""
    if profile["gpus"]:
        head = f"{_plural_of(profile['gpus'], 'GPU')} × {_plural_of(profile['nodes'], 'node')}"
    else:
        head = f"CPU × {_plural_of(profile['nodes'], 'node')}"
    parts = [head]
    if profile["cpu_cores"]:
        parts.append(_plural_of(profile["cpu_cores"], "core"))
    if profile["memory_gib"]:
        parts.append(f"{profile['memory_gib']:g} GiB")
    if profile["power_watts"] is not None:
        parts.append(f"{profile['power_watts'] / 1000:.1f} kW")
    text = ", ".join(parts)
    if profile["keep_within"]:
        text += f"; keep_within {profile['keep_within']}"
    if profile["node_selector"]:
        text += f"; {profile['node_selector']}"
    if profile.get("topology") not in (None, ANY):  # .get: a server from before topology was a field
        text += f"; topology {profile['topology']}"
    return text


REGISTRY.node_fields = frozenset(item.name for item in dataclasses.fields(NodeView))
for _item in BUILTIN_FILTERS:
    REGISTRY.add_filter(_item)
for _item in BUILTIN_SCORERS:
    REGISTRY.add_scorer(_item)
