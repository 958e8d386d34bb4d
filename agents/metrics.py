"""Node sensors on /metrics: a Prometheus collector that reads the latest readings on each scrape.

The collector runs one query per scrape (ready nodes' stored sensors), so every web process answers the
same figures and nothing is kept in memory between scrapes. An absent reading is an absent series, never
0; a node that stopped sending heartbeats (not ready) has no series at all, so a stale value never looks
live. `metrics_view` wraps django-prometheus's view with an optional bearer token.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterator

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import REGISTRY, Collector

GPU_LABELS = ["node", "gpu", "uuid"]
GPU_GAUGES = (
    ("llmgw_gpu_temperature_celsius", "temperature_celsius", "GPU temperature (NVML), degrees Celsius."),
    (
        "llmgw_gpu_memory_temperature_celsius",
        "memory_temperature_celsius",
        "GPU memory (HBM) temperature where the driver reports it, degrees Celsius.",
    ),
    ("llmgw_gpu_power_watts", "power_watts", "GPU power draw, watts."),
    ("llmgw_gpu_power_limit_watts", "power_limit_watts", "GPU enforced power limit, watts."),
)
NODE_GAUGES = (
    ("llmgw_node_cpu_temperature_celsius", "cpu_temperature_celsius", "Hottest CPU package (hwmon), degrees Celsius."),
    ("llmgw_node_cpu_power_watts", "cpu_power_watts", "CPU packages' power (RAPL), watts."),
    (
        "llmgw_node_inlet_temperature_celsius",
        "inlet_temperature_celsius",
        "Board inlet or ambient temperature, degrees Celsius.",
    ),
)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class NodeSensorsCollector(Collector):
    """llmgw_gpu_* and llmgw_node_* gauges from ready nodes' latest sensors, read on each scrape."""

    def collect(self) -> Iterator[Metric]:
        from agents.models import Node, heartbeat_is_fresh
        from agents.node.protocol import THROTTLE_REASONS

        now = timezone.now()
        gpu_families = {
            key: GaugeMetricFamily(name, doc, labels=GPU_LABELS) for name, key, doc in GPU_GAUGES
        }
        throttled = GaugeMetricFamily(
            "llmgw_gpu_throttled",
            "1 while the reason holds the GPU's clocks down, 0 for the other reasons it reports.",
            labels=[*GPU_LABELS, "reason"],
        )
        node_families = {key: GaugeMetricFamily(name, doc, labels=["node"]) for name, key, doc in NODE_GAUGES}
        rows = (
            Node.objects.filter(last_heartbeat_at__isnull=False)
            .order_by("name")
            .values_list("name", "last_heartbeat_at", "heartbeat_interval_seconds", "sensors")
        )
        for name, last_at, interval, sensors in rows:
            if not heartbeat_is_fresh(last_at, interval, now) or not isinstance(sensors, dict):
                continue  # not ready: its readings are stale, so no series
            for key, family in node_families.items():
                value = _number(sensors.get(key))
                if value is not None:
                    family.add_metric([name], value)
            for gpu in sensors.get("gpus") or []:
                if not isinstance(gpu, dict) or _number(gpu.get("index")) is None:
                    continue
                labels = [name, str(gpu["index"]), str(gpu.get("uuid") or "")]
                for key, family in gpu_families.items():
                    value = _number(gpu.get(key))
                    if value is not None:
                        family.add_metric(labels, value)
                reasons = gpu.get("throttle_reasons")
                if isinstance(reasons, list):  # absent: the agent could not read them, so no series
                    for reason in THROTTLE_REASONS:
                        throttled.add_metric([*labels, reason], 1.0 if reason in reasons else 0.0)
        yield from gpu_families.values()
        yield throttled
        yield from node_families.values()

    def describe(self) -> Iterator[Metric]:
        # Describing (not collecting) at registration keeps the database out of app start.
        for name, _, doc in GPU_GAUGES:
            yield GaugeMetricFamily(name, doc, labels=GPU_LABELS)
        yield GaugeMetricFamily("llmgw_gpu_throttled", "", labels=[*GPU_LABELS, "reason"])
        for name, _, doc in NODE_GAUGES:
            yield GaugeMetricFamily(name, doc, labels=["node"])


_collector: NodeSensorsCollector | None = None


def register_collector() -> NodeSensorsCollector:
    """Register the collector with prometheus_client's default registry, once per process."""
    global _collector
    if _collector is None:
        _collector = NodeSensorsCollector()
        REGISTRY.register(_collector)
    return _collector


def metrics_token() -> str:
    """LLMGW_METRICS_TOKEN: when set, /metrics takes `Authorization: Bearer <it>` (and nothing else)."""
    return getattr(settings, "LLMGW_METRICS_TOKEN", None) or os.environ.get("LLMGW_METRICS_TOKEN", "")


def _is_viewer(request: HttpRequest) -> bool:
    """A logged-in viewer, or `Authorization: Token <key>` of a user with the viewer role."""
    from rest_framework.authtoken.models import Token

    from llmgw.permissions import can_read

    if can_read(getattr(request, "user", None)):
        return True
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "token" or not key.strip():
        return False
    token = Token.objects.select_related("user").filter(key=key.strip()).first()
    return token is not None and token.user.is_active and can_read(token.user)


def metrics_view(request: HttpRequest) -> HttpResponse:
    """/metrics: the app's metrics and the node sensors, for a viewer (a Prometheus job with an API token
    of the viewer role), or behind LLMGW_METRICS_TOKEN alone when that is set."""
    from django_prometheus.exports import ExportToDjangoView

    expected = metrics_token()
    if not expected and not _is_viewer(request):
        response = HttpResponse(
            "/metrics: send Authorization: Token <an API token with the viewer role: llmgw ctl token create "
            "prometheus --role viewer>, or set LLMGW_METRICS_TOKEN and send it as a Bearer token\n",
            status=401,
            content_type="text/plain",
        )
        response["WWW-Authenticate"] = 'Token realm="metrics"'
        return response
    if expected:
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected.encode()):
            response = HttpResponse(
                "/metrics: send Authorization: Bearer <LLMGW_METRICS_TOKEN>\n", status=401, content_type="text/plain"
            )
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
    return ExportToDjangoView(request)
