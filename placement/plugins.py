"""The placement framework: every filter and scorer, built in or loaded, is one entry in one registry.

A **filter** turns a node down for a replica, in words (``gpu: 8 requested, 2 free``); a **scorer**
orders the nodes that pass (a smaller key ranks first) and says in explain's ``why:`` what it weighed.
Each is one entry with one signature — ``reject(node, placing)``, ``key(node, placing)``,
``why(node, placing)``, where ``placing`` is the plan's question (placement.planner.Placing) — its words
and the node's fields it reads (``reads``). The built-ins are registered by placement.planner in the order
it applies them, power last; the plain planner (:func:`placement.planner.plan_replica`), the index
(:mod:`placement.index`), the commit's re-check (placement.commit.recheck) and explain all read them from
:data:`REGISTRY`, so adding a rule is adding one entry.

A third-party plugin is a module (or any object) with ``FILTERS`` and/or ``SCORERS`` lists, or a
``register(registry)`` function, named in server.yaml (``placement: {plugins: [dotted.path]}``) or
published under the ``llmgw.plugins`` entry point; it is loaded once when a process starts. Its
filters run after the built-in ones and before power; its scorers take their place in the ordering by
``order`` (built-ins: spread 10, condition 20, rack headroom 30, tokens per joule 40, weights 50, bin
packing 60; the node's name last). A plugin's call fails closed, as Kubernetes' scheduler framework does:
one that raises (anything, SystemExit too), answers later than its time budget or answers what it may not
(a score that is not a finite number) refuses the node (``plugin <id>: raised ValueError: …``) if it is a
filter and scores 0 if it is a scorer; it is counted (/metrics), logged once per plugin and error, and after
PLUGIN_FAILURES_TO_SWITCH_OFF failures in a row switched off for PLUGIN_COOL_OFF_SECONDS (not called:
its filter refuses every node, its scorer scores 0), then tried again. Its words are cut to
PLUGIN_TEXT_CHARS. A rule not built in that says which of a node's fields it reads keeps the index's
incremental plans (its verdicts and keys kept until those fields move); one that does not say, or one
failing now, sends every plan the plain way (:meth:`Registry.plain_path_reason` says why; the index logs it).

Pure: no Django (the loader imports modules by name, nothing else).
"""

from __future__ import annotations

import importlib
import logging
import math
import numbers
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Filter:
    """A rule that turns a node down: ``reject(node, placing)`` returns the words, or None to pass.

    ``placing`` is the plan's question (placement.planner.Placing): the request's ``model``, ``profile`` and
    ``existing``, and what the plan works out once (the facility, the nodes excluded, each node's hold).
    ``rechecked``: the guarded commit asks it again of each chosen node, on the node's locked row (its
    readiness, cordon, holds, labels), through this same function. The built-in resource filters are not:
    the commit's guarded writes are what keep cards, cores and memory from being booked twice; nor is
    power, which the commit counts with the batch's other shards (placement.planner.power_rejection_in).
    ``reads``: the node's fields its answer rests on, with the request's model and profile (e.g.
    ``frozenset({"labels"})``); None: not said, and the index then plans the plain way.
    ``asks(profile, exclude)``: whether it can turn down a node that is ready, not cordoned, not held and
    has the cards free (the index's candidates), for this profile; None: it can.
    """

    id: str
    reject: Callable[[Any, Any], str | None]
    doc: str = ""
    builtin: bool = False
    rechecked: bool = True
    reads: frozenset[str] | None = None
    asks: Callable[[Any, frozenset[str]], bool] | None = None


@dataclass(frozen=True, slots=True)
class Scorer:
    """A rule that orders nodes: ``key(node, placing)`` (smaller first), ``why(node, placing)`` its words.

    ``reads``: the node's fields its key rests on, with the request's model and profile; None: not said
    (the index then plans the plain way). A scorer that says keeps the index: its keys are worked out
    once a node and model, and again when one of those fields moves.
    """

    id: str
    key: Callable[[Any, Any], float]
    why: Callable[[Any, Any], str | None] | None = None
    order: int = 55
    doc: str = ""
    builtin: bool = False
    reads: frozenset[str] | None = None


# The filter that comes last, whatever is loaded (placement.planner registers it): a loaded filter goes
# before it.
LAST_FILTER = "power"

# A plugin's words kept (a refusal, a why, an error's message): a 5 MB reason is cut to this.
PLUGIN_TEXT_CHARS = 200
# The time one plugin call may take: an answer later than this is not taken (a filter's node is refused,
# a scorer's scores neutral), and counts as a failure.
PLUGIN_CALL_SECONDS = 0.05
# Failures in a row (raised, over its time, an answer of the wrong kind) that switch a plugin off.
PLUGIN_FAILURES_TO_SWITCH_OFF = 10
# How long a plugin switched off stays off before it is tried again.
PLUGIN_COOL_OFF_SECONDS = 300.0
# The failures of the loaded plugins told apart in the log (each plugin, kind and error once).
_REPORTED_KEPT = 256

# What a caller does with a call that failed, said in the log once per plugin and failure.
_CONSEQUENCE = {"filter": "the node is refused", "scorer": "it scores 0 (neutral)", "why": "it says nothing",
                "load": "it is skipped"}


@dataclass
class PluginHealth:
    """How one plugin (its id: a filter and a scorer of one id together) has fared: failures in a row,
    and while it is switched off, until when (the registry's clock) and the words said of it."""

    failures: int = 0
    off_until: float | None = None
    off_words: str = ""
    last: str = ""


@dataclass
class Registry:
    """Every filter and scorer, built-in and loaded, and what went wrong with the loaded ones."""

    filters: list[Filter] = field(default_factory=list)
    scorers: list[Scorer] = field(default_factory=list)
    # `plugin rack-affinity: raised ValueError: …`: each kind of failure once, newest last (bounded).
    errors: list[str] = field(default_factory=list)
    loaded: list[str] = field(default_factory=list)  # the plugins loaded, by name
    # The clock a call's time is measured on and a cool-off counted on (tests move their own).
    clock: Callable[[], float] = time.monotonic
    call_seconds: float = PLUGIN_CALL_SECONDS
    # Failures so far in this process by (plugin, kind: filter, scorer, why or load, error: raised,
    # overran or invalid), and the times each plugin was switched off: /metrics reads them.
    failure_counts: Counter = field(default_factory=Counter)
    switch_offs: Counter = field(default_factory=Counter)
    health: dict[str, PluginHealth] = field(default_factory=dict)
    # What of the counts was sent on to where every process's /metrics reads them (placement.explain).
    sent: Counter = field(default_factory=Counter)
    _reported: set[tuple[str, str, str]] = field(default_factory=set, repr=False)
    # The fields a node has (placement.planner.NodeView's, set when the planner registers its built-ins):
    # what a rule's ``reads`` may name.
    node_fields: frozenset[str] = frozenset()
    # Moves with every filter or scorer added or removed: what is worked out of the rules is kept by it.
    version: int = 0
    _reads: dict[tuple[int, str], frozenset[str]] = field(default_factory=dict, repr=False)
    _external: tuple[int, bool] = field(default=(-1, False), repr=False)

    def add_filter(self, item: Filter) -> None:
        """Register a filter: after those there are, before power (the last)."""
        self._refuse_twice(item.id)
        at = len(self.filters)
        if self.filters and self.filters[-1].id == LAST_FILTER:
            at -= 1
        self.filters.insert(at, item)
        self.version += 1

    def add_scorer(self, item: Scorer) -> None:
        self._refuse_twice(item.id, scorer=True)
        self.scorers.append(item)
        self.scorers.sort(key=lambda s: s.order)
        self.version += 1

    def _refuse_twice(self, plugin_id: str, scorer: bool = False) -> None:
        # A plugin may bring a filter and a scorer of one id; two of one kind is a mistake.
        if any(p.id == plugin_id for p in (self.scorers if scorer else self.filters)):
            raise ValueError(f"plugin id {plugin_id!r} is registered already")

    @property
    def external_filters(self) -> list[Filter]:
        """The filters not built in (loaded plugins' and rules added since), in their order."""
        return [f for f in self.filters if not f.builtin]

    @property
    def external_scorers(self) -> list[Scorer]:
        """The scorers not built in, by order."""
        return [s for s in self.scorers if not s.builtin]

    def plain_path_reason(self) -> str | None:
        """Why the index plans the plain way with what is loaded, or None while it keeps its plans: a filter
        or scorer not built in that does not say which of a node's fields it reads (or names one a node has
        not), or one failing now (a failure's words are not kept)."""
        for item in (*self.external_filters, *self.external_scorers):
            kind = "filter" if isinstance(item, Filter) else "scorer"
            if item.reads is None:
                return f"{kind} {item.id} does not say which of a node's fields it reads"
            unknown = sorted(item.reads - self.node_fields) if self.node_fields else []
            if unknown:
                return f"{kind} {item.id} reads {', '.join(unknown)}, not a field of a node"
            health = self.health.get(item.id)
            if health is not None and (health.failures or health.off_until is not None):
                return f"plugin {item.id} is failing now"
        return None

    @property
    def index_keeps(self) -> bool:
        """True while the index may plan with what is loaded (plain_path_reason says why not)."""
        return self.plain_path_reason() is None

    @property
    def has_external(self) -> bool:
        """True once a filter or scorer not built in is registered (worked out once a version: each plan
        asks)."""
        if self._external[0] != self.version:
            self._external = (self.version, any(not p.builtin for p in (*self.filters, *self.scorers)))
        return self._external[1]

    def failed(self, plugin_id: str, exc: BaseException, kind: str = "load") -> str:
        """Report a plugin that raised; returns ``plugin <id>: raised <type>: <message>``."""
        return self._failure(plugin_id, kind, "raised", f"raised {_error_words(exc)}")

    def _failure(self, plugin_id: str, kind: str, error: str, words: str) -> str:
        """Count one failed call, say it in the log (once per plugin, kind and error), and switch the
        plugin off once it failed PLUGIN_FAILURES_TO_SWITCH_OFF times in a row. Returns the words."""
        text = f"plugin {plugin_id}: {words}"
        self.failure_counts[(plugin_id, kind, error)] += 1
        reported = (plugin_id, kind, text if kind == "load" else error)
        if reported not in self._reported and len(self._reported) < _REPORTED_KEPT:
            self._reported.add(reported)
            if text not in self.errors:
                self.errors = [*self.errors[-19:], text]
            log.warning("%s; %s", text, _CONSEQUENCE.get(kind, "it is skipped"))
        if kind == "load":
            return text
        health = self.health.setdefault(plugin_id, PluginHealth())
        health.failures += 1
        health.last = words
        if health.failures >= PLUGIN_FAILURES_TO_SWITCH_OFF and health.off_until is None:
            health.off_until = self.clock() + PLUGIN_COOL_OFF_SECONDS
            health.off_words = (
                f"plugin {plugin_id}: switched off after {health.failures} failures in a row (last: {words})"
            )
            self.switch_offs[plugin_id] += 1
            log.warning("%s; it is tried again in %g s, its filter refusing every node and its scorer "
                        "scoring 0 until then", health.off_words, PLUGIN_COOL_OFF_SECONDS)
        return text

    def switched_off(self, plugin_id: str) -> str | None:
        """The words of a plugin switched off now, or None; once its cool-off is over it is tried again
        (one more failure switches it off again)."""
        health = self.health.get(plugin_id)
        if health is None or health.off_until is None:
            return None
        if self.clock() < health.off_until:
            return health.off_words
        health.off_until, health.off_words = None, ""
        health.failures = PLUGIN_FAILURES_TO_SWITCH_OFF - 1
        log.warning("plugin %s: tried again after its cool-off", plugin_id)
        return None

    def call(self, item: Filter | Scorer, kind: str, fn: Callable[[Any, Any], Any], node: Any, request: Any,
             check: Callable[[Any], str | None]) -> tuple[Any, str | None]:
        """Call one plugin function within its time budget: (its answer, None), or (None, the failure's
        words: ``plugin <id>: …``) when it is switched off, raised (anything: SystemExit and
        KeyboardInterrupt too), took longer than ``call_seconds`` or answered what ``check`` refuses."""
        off = self.switched_off(item.id)
        if off is not None:
            return None, off
        start = self.clock()
        try:
            value = fn(node, request)
        except BaseException as exc:  # noqa: BLE001 - a plugin's bug, of whatever kind, costs only itself
            return None, self._failure(item.id, kind, "raised", f"raised {_error_words(exc)}")
        took = self.clock() - start
        if took > self.call_seconds:
            return None, self._failure(
                item.id, kind, "overran", f"took {took:.3g} s, over its {self.call_seconds:g} s budget"
            )
        wrong = check(value)
        if wrong is not None:
            return None, self._failure(item.id, kind, "invalid", wrong)
        health = self.health.get(item.id)
        if health is not None:
            health.failures = 0
        return value, None

    def reads_of(self, kind: str) -> frozenset[str]:
        """The node's fields read by the filters before power (``kind`` "filters"), by the filters not built
        in ("other filters") or by the scorers not built in ("other scorers"): what the index keeps its
        rejections, verdicts and keys by."""
        known = self._reads.get((self.version, kind))
        if known is None:
            if len(self._reads) > 16:
                self._reads.clear()
            items = {
                "filters": [f for f in self.filters if f.id != LAST_FILTER],
                "other filters": self.external_filters,
                "other scorers": self.external_scorers,
            }[kind]
            known = self._reads[(self.version, kind)] = frozenset().union(*(i.reads or () for i in items))
        return known

    def refusal(self, item: Filter, node: Any, placing: Any) -> str | None:
        """A filter not built in asked of a node: ``<id>: <words>``, None when it passes, or the failure's
        words (``plugin <id>: raised ValueError: …``): fail closed."""
        return self.verdict(item, node, placing)[0]

    def verdict(self, item: Filter, node: Any, placing: Any) -> tuple[str | None, bool]:
        """refusal's words, and whether they are a failure's (not to be kept)."""
        reason, failure = self.call(item, "filter", item.reject, node, placing, _reason_check)
        if failure is not None:
            return failure, True
        return (f"{item.id}: {_cut(reason)}" if reason else None), False

    def score(self, item: Scorer, node: Any, placing: Any) -> float:
        """A scorer not built in asked of a node: its key, or 0 (neutral) where it failed."""
        value, failure = self.call(item, "scorer", item.key, node, placing, _key_check)
        return 0.0 if failure is not None else float(value)

    def whys(self, scorers: Iterable[Scorer], node: Any, placing: Any) -> list[str]:
        """The words of scorers not built in for the chosen node, each naming its scorer."""
        words = []
        for item in scorers:
            if item.why is None:
                continue
            text, failure = self.call(item, "why", item.why, node, placing, _reason_check)
            if failure is None and text:
                words.append(f"{_cut(text)} ({item.id})")
        return words

    def remove_external(self) -> None:
        """Back to the built-ins alone (tests; a process that loads again)."""
        self.filters = [f for f in self.filters if f.builtin]
        self.scorers = [s for s in self.scorers if s.builtin]
        self.version += 1
        self.errors, self.loaded, self._reported = [], [], set()
        self.failure_counts, self.switch_offs, self.health, self.sent = Counter(), Counter(), {}, Counter()
        self.clock, self.call_seconds = time.monotonic, PLUGIN_CALL_SECONDS


def _cut(text: str) -> str:
    """A plugin's words within PLUGIN_TEXT_CHARS."""
    return text if len(text) <= PLUGIN_TEXT_CHARS else text[: PLUGIN_TEXT_CHARS - 1] + "…"


def _error_words(exc: BaseException) -> str:
    """``ValueError: its message`` (cut); a message that itself raises is left out."""
    try:
        message = str(exc)
    except BaseException:  # noqa: BLE001 - an exception whose __str__ raises
        message = "(its message could not be read)"
    return _cut(f"{type(exc).__name__}: {message}" if message else type(exc).__name__)


def _reason_check(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return None
    return f"returned {_cut(type(value).__name__)}, not the refusal's words or None"


def _key_check(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return f"scored {_cut(type(value).__name__)}, not a number"
    try:
        number = float(value)
    except (OverflowError, ValueError):
        return "scored a number too large"
    return None if math.isfinite(number) else f"scored {number}, not a finite number"


def external_rejection(registry: Registry, node: Any, placing: Any, *, rechecked: bool = False) -> str | None:
    """The first filter not built in that turns the node down, as ``<id>: <words>``; a filter that fails
    refuses the node in the failure's words (``plugin <id>: raised ValueError: …``): fail closed.
    ``rechecked``: only the filters the guarded commit asks again."""
    for item in registry.external_filters:
        if rechecked and not item.rechecked:
            continue
        reason = registry.refusal(item, node, placing)
        if reason is not None:
            return reason
    return None


def external_keys(registry: Registry, node: Any, placing: Any) -> dict[str, float]:
    """Each scorer's key not built in for the node (0 where it failed or is switched off: neutral)."""
    return {item.id: registry.score(item, node, placing) for item in registry.external_scorers}


def external_why(registry: Registry, node: Any, placing: Any) -> list[str]:
    """The words of the scorers not built in for the chosen node."""
    return registry.whys(registry.external_scorers, node, placing)


def plugin_register(registry: Registry, plugin: Any, name: str) -> None:
    """Add what ``plugin`` (a module or object) offers: its ``register(registry)``, or its FILTERS and SCORERS."""
    register = getattr(plugin, "register", None)
    if callable(register):
        register(registry)
        return
    filters, scorers = getattr(plugin, "FILTERS", None), getattr(plugin, "SCORERS", None)
    if filters is None and scorers is None:
        raise ValueError(f"{name} has no register(registry), FILTERS or SCORERS")
    for item in filters or ():
        if not isinstance(item, Filter):
            raise ValueError(f"{name}: FILTERS holds {type(item).__name__}, not placement.plugins.Filter")
        registry.add_filter(item)
    for item in scorers or ():
        if not isinstance(item, Scorer):
            raise ValueError(f"{name}: SCORERS holds {type(item).__name__}, not placement.plugins.Scorer")
        registry.add_scorer(item)


def plugins_load(registry: Registry, names: Iterable[str], *, entry_points: bool = True) -> list[str]:
    """Load the plugins named (dotted paths) and those published as ``llmgw.plugins`` entry points.

    Returns what was loaded; a plugin that cannot be imported or registered is reported and skipped.
    """
    loaded: list[str] = []
    sources: list[tuple[str, Callable[[], Any]]] = [(n, lambda n=n: _import(n)) for n in names]
    if entry_points:
        from importlib.metadata import entry_points as found

        sources += [(ep.name, ep.load) for ep in found(group="llmgw.plugins")]
    for name, load in sources:
        try:
            plugin_register(registry, load(), name)
        except BaseException as exc:  # noqa: BLE001 - a plugin that exits while loading costs only itself
            registry.failed(name, exc)
            continue
        loaded.append(name)
    registry.loaded = [*registry.loaded, *loaded]
    return loaded


def _import(dotted: str) -> Any:
    """A module (``pkg.mod``) or an attribute of one (``pkg.mod:obj`` or ``pkg.mod.obj``)."""
    if ":" in dotted:
        module, _, attr = dotted.partition(":")
        return getattr(importlib.import_module(module), attr)
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError:
        module, _, attr = dotted.rpartition(".")
        if not module:
            raise
        return getattr(importlib.import_module(module), attr)


# The one registry of a process; the planner's built-ins are registered by placement.planner.
REGISTRY = Registry()
