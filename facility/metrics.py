"""Domains (and N−1 feed-loss violations) on /metrics: each domain's budget, limit, reserved, measured and used watts, and its hold.

Read on each scrape through facility.selectors.facility_overview — the figures `llmgw ctl facility` and
the API show — so the alert rules in deploy/prometheus/alerts.yaml judge what people see.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import REGISTRY, Collector

LABELS = ["domain", "level"]
GAUGES = (
    ("llmgw_domain_power_budget_watts", "cap_watts", "The domain's cap: what one feed carries alone, derated."),
    ("llmgw_domain_power_limit_watts", "limit_watts", "The cap less the margin: what placement may fill."),
    ("llmgw_domain_reserved_watts", "reserved_watts", "The draw placed in the domain (declared or derived)."),
    ("llmgw_domain_measured_watts", "measured_watts", "What the domain's nodes read, where they read it."),
    ("llmgw_domain_use_watts", "use_watts", "The domain's use as placement counts it against the limit."),
)


class DomainPowerCollector(Collector):
    """llmgw_domain_* gauges; a figure nobody knows (no budget, no reading) has no series."""

    def collect(self) -> Iterator[Metric]:
        from facility.selectors import facility_overview

        families = {key: GaugeMetricFamily(name, doc, labels=LABELS) for name, key, doc in GAUGES}
        held = GaugeMetricFamily("llmgw_domain_held", "1 while the domain is held (2 while it drains).",
                                 labels=LABELS)
        for domain in facility_overview()["domains"]:
            labels = [domain["domain"], domain["level"]]
            for _, key, _ in GAUGES:
                if domain[key] is not None:
                    families[key].add_metric(labels, float(domain[key]))
            hold = domain["hold"]
            held.add_metric(labels, 0.0 if hold is None else 2.0 if hold["drain"] else 1.0)
        yield from families.values()
        yield held
        yield from condition_families()
        yield self._feed_loss()
        yield self._netbox()
        yield from self._feeds()
        yield shed_moves()

    def _netbox(self) -> Metric:
        from facility.models import DcimSync

        family = GaugeMetricFamily(
            "llmgw_netbox_pending_changes",
            "Changes NetBox has that wait for a person's yes (caps that would rise or vanish, feeds removed), by site.",
            labels=["site"],
        )
        for site, pending in DcimSync.objects.values_list("site", "pending"):
            family.add_metric([site or "all"], float(len(pending or [])))
        return family

    def _feed_loss(self) -> Metric:
        from facility.feed_selectors import feed_loss_report

        family = GaugeMetricFamily(
            "llmgw_feed_loss_violations",
            "Racks, PDUs and feeds that would pass what carries them if this feed were lost (0 is the state to keep).",
            labels=["feed"],
        )
        for item in feed_loss_report()["feeds"]:
            family.add_metric([item["feed"]], float(len(item["violations"])))
        return family

    def _feeds(self) -> Iterator[Metric]:
        from facility.feed_selectors import feeds_overview

        failed = GaugeMetricFamily("llmgw_feed_failed", "1 while the feed's status is failed (lost now).",
                                   labels=["feed"])
        imbalance = GaugeMetricFamily(
            "llmgw_pdu_leg_imbalance_ratio",
            "How far a three-phase PDU's busiest or idlest leg is from its legs' mean, as a share of it.",
            labels=["pdu", "feed"],
        )
        for feed in feeds_overview()["feeds"]:
            failed.add_metric([feed["name"]], 1.0 if feed["status"] == "failed" else 0.0)
            for pdu in feed["legs"]:
                if pdu["imbalance"] is not None:
                    imbalance.add_metric([pdu["pdu"], feed["name"]], float(pdu["imbalance"]))
        yield failed
        yield imbalance

    def describe(self) -> Iterator[Metric]:
        for name, _, doc in GAUGES:
            yield GaugeMetricFamily(name, doc, labels=LABELS)
        yield GaugeMetricFamily("llmgw_domain_held", "", labels=LABELS)
        for name, _, labels in CONDITION_FAMILIES:
            yield GaugeMetricFamily(name, "", labels=labels)

        yield GaugeMetricFamily("llmgw_feed_loss_violations", "", labels=["feed"])
        yield GaugeMetricFamily("llmgw_netbox_pending_changes", "", labels=["site"])
        yield GaugeMetricFamily("llmgw_feed_failed", "", labels=["feed"])
        yield GaugeMetricFamily("llmgw_pdu_leg_imbalance_ratio", "", labels=["pdu", "feed"])
        yield CounterMetricFamily("llmgw_shed_moves", "", labels=["domain", "outcome"])


def shed_moves() -> Metric:
    """llmgw_shed_moves_total{domain,outcome}: shedding's actions (move, drop, stays), counted from the
    events timeline (kept 30 days, so the count is of those 30 days)."""
    from django.db.models import Count

    from facility.models import ConditionEvent

    family = CounterMetricFamily(
        "llmgw_shed_moves", "Shedding's actions per domain: move (replacement first), drop (batch), stays (no room).",
        labels=["domain", "outcome"],
    )
    rows = (
        ConditionEvent.objects.filter(readings__has_key="shed")
        .values_list("domain", "readings__shed__action")
        .annotate(n=Count("id"))
        .order_by()
    )
    for domain, outcome, n in rows:
        family.add_metric([domain, str(outcome)], float(n))
    return family

CONDITION_FAMILIES = (
    ("llmgw_domain_condition", "1 for the domain's current thermal condition, 0 for the others.",
     [*LABELS, "condition"]),
    ("llmgw_domain_reading_age_seconds", "How old the domain's latest reading of a signal is.", [*LABELS, "signal"]),
    ("llmgw_facility_source_up", "1 while a facility source answered its last poll.", ["source"]),
    ("llmgw_domain_condition_age_seconds",
     "How long ago the domain's condition was last judged (set by hand: not given); it grows while the "
     "evaluation has stopped.", LABELS),
)


def condition_families() -> Iterator[Metric]:
    """Conditions, reading ages and source status, from what `llmgw ctl facility` shows."""
    from django.utils import timezone

    from facility.conditions import CONDITIONS
    from facility.evaluation import effective_conditions
    from facility.models import DomainCondition, SourceStatus

    condition, age, up, judged = (
        GaugeMetricFamily(name, doc, labels=labels) for name, doc, labels in CONDITION_FAMILIES
    )
    now = timezone.now().timestamp()
    for domain, state in sorted(effective_conditions().items()):
        labels = [domain, domain.split(":", 1)[0]]
        for name in CONDITIONS:
            condition.add_metric([*labels, name], 1.0 if state["condition"] == name else 0.0)
        if not state["overridden"] and state.get("evaluated_at") is not None:
            judged.add_metric(labels, max(0.0, now - state["evaluated_at"]))
    for domain, readings in DomainCondition.objects.values_list("domain", "readings"):
        for signal, reading in sorted((readings or {}).items()):
            age.add_metric([domain, domain.split(":", 1)[0], signal], max(0.0, now - reading["at"]))
    for name, is_up in SourceStatus.objects.values_list("name", "up"):
        up.add_metric([name], 1.0 if is_up else 0.0)
    yield condition
    yield age
    yield up
    yield judged


_collector: DomainPowerCollector | None = None


def register_collector() -> DomainPowerCollector:
    global _collector
    if _collector is None:
        _collector = DomainPowerCollector()
        REGISTRY.register(_collector)
    return _collector
