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


def _plugin_families() -> tuple[CounterMetricFamily, CounterMetricFamily]:
    return (
        CounterMetricFamily(
            "llmgw_plugin_errors",
            "Failed calls of a loaded placement plugin: raised, over its time budget, or a wrong answer.",
            labels=["plugin", "kind", "error"],
        ),
        CounterMetricFamily(
            "llmgw_plugin_switched_off",
            "Times a placement plugin was switched off for a cool-off after failing again and again.",
            labels=["plugin"],
        ),
    )


class PluginErrorsCollector(Collector):
    """llmgw_plugin_errors_total{plugin,kind,error} and llmgw_plugin_switched_off_total{plugin}: kept in
    Redis with workers, in the process otherwise."""

    def collect(self) -> Iterator[Metric]:
        from placement.explain import plugin_counts

        failed, switched = plugin_counts()
        errors, offs = _plugin_families()
        for labels, count in sorted(failed.items()):
            errors.add_metric(list(labels), float(count))
        for plugin, count in sorted(switched.items()):
            offs.add_metric([plugin], float(count))
        yield errors
        yield offs

    def describe(self) -> Iterator[Metric]:
        yield from _plugin_families()


_collector: PlacementWouldCollector | None = None


def register_collector() -> PlacementWouldCollector:
    global _collector
    if _collector is None:
        _collector = PlacementWouldCollector()
        REGISTRY.register(_collector)
        REGISTRY.register(PluginErrorsCollector())
    return _collector
