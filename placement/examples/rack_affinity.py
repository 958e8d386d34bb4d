"""An example placement plugin: rack affinity, a filter and a scorer.

A node labelled ``affinity.llmgw.io/models=llama-70b,mixtral`` is kept for those models: another
model's replica is turned down there (``rack-affinity: kept for llama-70b, mixtral``), and those models
prefer it over nodes without the label. Load it with server.yaml::

    placement:
      plugins: [placement.examples.rack_affinity]

A plugin is any importable object with ``FILTERS`` and ``SCORERS`` lists (or a ``register(registry)``
function), each rule with the one signature the built-in rules have. A filter's ``reject(node, request)``
returns the refusal's words or None; a scorer's ``key(node, request)`` is a number, smaller first, and its
``order`` places it among the built-ins (spread 10, condition 20, rack headroom 30, tokens per joule 40,
weights 50, bin packing 60); its ``why(node, request)`` words appear in explain's ``why:``; ``reads`` names
the node's fields each answer rests on (the index keeps it then). ``node`` is a
:class:`placement.planner.NodeView` (``name``, ``labels``, ``domains``, ``free_gpus`` …) and ``request``
a :class:`placement.planner.Placing` (``model``, ``profile``, ``existing``, ``facility`` …).
"""

from __future__ import annotations

from placement.plugins import Filter, Scorer

LABEL = "affinity.llmgw.io/models"


def _kept_for(node) -> list[str]:
    return [m.strip() for m in (node.labels.get(LABEL) or "").split(",") if m.strip()]


def reject(node, request) -> str | None:
    kept = _kept_for(node)
    if kept and request.model not in kept:
        return f"kept for {', '.join(kept)}"
    return None


def key(node, request) -> int:
    return 0 if request.model in _kept_for(node) else 1


def why(node, request) -> str | None:
    return f"kept for {request.model}" if request.model in _kept_for(node) else None


# Both read the node's labels alone (with the request's model): the index keeps its plans with them loaded,
# their verdicts and keys kept until a node's labels move.
FILTERS = [Filter("rack-affinity", reject, "nodes labelled for some models take only those",
                  reads=frozenset({"labels"}))]
# Before the rack headroom: an affine node wins over one with more power left.
SCORERS = [Scorer("rack-affinity", key, why, order=25, doc="a model prefers the nodes labelled for it",
                  reads=frozenset({"labels"}))]
