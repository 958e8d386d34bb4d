"""The placement framework: filters and scorers are plugins in one registry.

A **filter** turns a node down for a replica, in words (``gpu: 8 requested, 2 free``); a **scorer**
orders the nodes that pass (a smaller key ranks first) and says in explain's ``why:`` what it weighed.
The built-ins are registered here, in the order the planner applies them; the plain planner
(:func:`placement.planner.plan_replica`) reads them from :data:`REGISTRY`, the index
(:mod:`placement.index`) keeps the same answers (property tests hold the two together), the guarded
commit re-checks power through the planner's own rule, and explain prints the words.

A third-party plugin is a module (or any object) with ``FILTERS`` and/or ``SCORERS`` lists, or a
``register(registry)`` function, named in server.yaml (``placement: {plugins: [dotted.path]}``) or
published under the ``llmgw.plugins`` entry point; it is loaded once when a process starts. Its
filters run after the built-in ones and before power; its scorers take their place in the ordering by
``order`` (built-ins: spread 10, condition 20, rack headroom 30, tokens per joule 40, weights 50, bin
packing 60; the node's name last). A plugin that raises is reported (``errors``, logged once) and
skipped for that node: it never blocks placement. With a third-party plugin loaded the index plans
through the plain path (it has no incremental form of another's rule), so the two stay equal.

Pure: no Django (the loader imports modules by name, nothing else).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Filter:
    """A rule that turns a node down: ``reject(node, request)`` returns the words, or None to pass.

    ``rechecked``: the guarded commit asks it again of each chosen node, on the node's locked row (its
    readiness, cordon, holds, labels), through this same function. The built-in resource filters are not:
    the commit's guarded writes are what keep cards, cores and memory from being booked twice.
    """

    id: str
    reject: Callable[[Any, Any], str | None]
    doc: str = ""
    builtin: bool = False
    rechecked: bool = True


@dataclass(frozen=True, slots=True)
class Scorer:
    """A rule that orders nodes: ``key(node, request)`` (smaller first), ``why(node, request)`` its words."""

    id: str
    key: Callable[[Any, Any], float]
    why: Callable[[Any, Any], str | None] | None = None
    order: int = 55
    doc: str = ""
    builtin: bool = False


@dataclass
class Registry:
    """Every filter and scorer, built-in and loaded, and what went wrong with the loaded ones."""

    filters: list[Filter] = field(default_factory=list)
    scorers: list[Scorer] = field(default_factory=list)
    # `plugin rack-affinity raised ValueError: …`: each kind of failure once, newest last (bounded).
    errors: list[str] = field(default_factory=list)
    loaded: list[str] = field(default_factory=list)  # the plugins loaded, by name
    _reported: set[str] = field(default_factory=set, repr=False)

    def add_filter(self, item: Filter) -> None:
        self._refuse_twice(item.id)
        self.filters.append(item)

    def add_scorer(self, item: Scorer) -> None:
        self._refuse_twice(item.id, scorer=True)
        self.scorers.append(item)
        self.scorers.sort(key=lambda s: s.order)

    def _refuse_twice(self, plugin_id: str, scorer: bool = False) -> None:
        # A plugin may bring a filter and a scorer of one id; two of one kind is a mistake.
        if any(p.id == plugin_id for p in (self.scorers if scorer else self.filters)):
            raise ValueError(f"plugin id {plugin_id!r} is registered already")

    @property
    def external_filters(self) -> list[Filter]:
        return [f for f in self.filters if not f.builtin]

    @property
    def external_scorers(self) -> list[Scorer]:
        return [s for s in self.scorers if not s.builtin]

    @property
    def has_external(self) -> bool:
        """True once a third-party filter or scorer is loaded (the index then plans the plain way)."""
        return any(not p.builtin for p in (*self.filters, *self.scorers))

    def failed(self, plugin_id: str, exc: BaseException) -> None:
        """Report a plugin that raised: once per plugin and kind of error (a failing plugin is skipped)."""
        text = f"plugin {plugin_id} raised {type(exc).__name__}: {str(exc)[:200]}"
        if text in self._reported:
            return
        self._reported.add(text)
        self.errors = [*self.errors[-19:], text]
        log.warning("%s; it is skipped", text)

    def remove_external(self) -> None:
        """Back to the built-ins alone (tests; a process that loads again)."""
        self.filters = [f for f in self.filters if f.builtin]
        self.scorers = [s for s in self.scorers if s.builtin]
        self.errors, self.loaded, self._reported = [], [], set()


def external_rejection(registry: Registry, node: Any, request: Any, *, rechecked: bool = False) -> str | None:
    """The first loaded filter that turns the node down, as ``<id>: <words>``; a filter that raises passes.
    ``rechecked``: only the filters the guarded commit asks again."""
    for item in registry.external_filters:
        if rechecked and not item.rechecked:
            continue
        try:
            reason = item.reject(node, request)
        except Exception as exc:  # a plugin's bug never blocks placement
            registry.failed(item.id, exc)
            continue
        if reason:
            return f"{item.id}: {reason}"
    return None


def external_keys(registry: Registry, node: Any, request: Any) -> dict[str, float]:
    """Each loaded scorer's key for the node (0 where it raised: that scorer then orders nothing)."""
    keys: dict[str, float] = {}
    for item in registry.external_scorers:
        try:
            value = item.key(node, request)
            keys[item.id] = float(value)
        except Exception as exc:
            registry.failed(item.id, exc)
            keys[item.id] = 0.0
    return keys


def external_why(registry: Registry, node: Any, request: Any) -> list[str]:
    """The loaded scorers' words for the chosen node."""
    words = []
    for item in registry.external_scorers:
        if item.why is None:
            continue
        try:
            text = item.why(node, request)
        except Exception as exc:
            registry.failed(item.id, exc)
            continue
        if text:
            words.append(f"{text} ({item.id})")
    return words


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
        except Exception as exc:
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
