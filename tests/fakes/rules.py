"""A placement rule defined outside the product, registered as one entry each: a filter that keeps nodes
labelled ``quiet=yes`` out (a node in a quiet hour takes no new replica) and a scorer that puts the nodes
labelled ``tier=gold`` first. Tests add them to the registry and see them in the plan, the index, the
commit's re-check and explain."""

from __future__ import annotations

from placement.plugins import Filter, Scorer

QUIET = "quiet"
TIER = "tier"


def quiet_reject(node, placing) -> str | None:
    return "in its quiet hour" if node.labels.get(QUIET) == "yes" else None


def gold_key(node, placing) -> int:
    return 0 if node.labels.get(TIER) == "gold" else 1


def gold_why(node, placing) -> str | None:
    return "a gold node" if node.labels.get(TIER) == "gold" else None


QUIET_HOURS = Filter("quiet-hours", quiet_reject, "a node in its quiet hour takes nothing new",
                     reads=frozenset({"labels"}))
GOLD_FIRST = Scorer("gold-first", gold_key, gold_why, order=15, doc="gold nodes first",
                    reads=frozenset({"labels"}))
