"""Placement on /metrics: what observe mode says enforcement would have done, counted across processes."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import REGISTRY, Collector

WOULD_HELP = "Placements that thermal enforcement would have refused or scored down (observe mode)."


class PlacementWouldCollector(Collector):
    """llmgw_placement_would_total{decision}: kept in Redis with workers, in the process otherwise."""

    def collect(self) -> Iterator[Metric]:
        from placement.explain import would_counts

        family = CounterMetricFamily("llmgw_placement_would", WOULD_HELP, labels=["decision"])
        for decision, count in sorted(would_counts().items()):
            if count:  # as a labelled counter does: a decision never made has no series yet
                family.add_metric([decision], float(count))
        yield family

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily("llmgw_placement_would", WOULD_HELP, labels=["decision"])


_collector: PlacementWouldCollector | None = None


def register_collector() -> PlacementWouldCollector:
    global _collector
    if _collector is None:
        _collector = PlacementWouldCollector()
        REGISTRY.register(_collector)
    return _collector
