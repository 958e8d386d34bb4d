"""Node sensors on /metrics: the latest readings, read on each scrape and written in the text format.

One query per scrape (ready nodes' stored sensors), so every web process answers the same figures and
nothing is kept in memory between scrapes. An absent reading is an absent series, never
0; a node that stopped sending heartbeats (not ready) has no series at all, so a stale value never looks
live. `metrics_view` wraps django-prometheus's view with an optional bearer token.
"""

from __future__ import annotations

import hmac
import math
import os

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

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
THROTTLED_DOC = "1 while the reason holds the GPU's clocks down, 0 for the other reasons it reports."
# Flags of a node, a series only while it is flagged (each doc one literal: the docs' metrics page reads it).
IMPLAUSIBLE_GAUGE = (
    "llmgw_node_implausible_readings", "Readings of its last heartbeat dropped: readings the node cannot have read."
)
# Per kind over the fleet (agents.node.protocol.IMPLAUSIBLE_KINDS), from the stored heartbeats rather than a
# counter in each web process: every process answers the same figure, and one restarted loses nothing.
IMPLAUSIBLE_KINDS_GAUGE = (
    "llmgw_readings_implausible",
    "Readings dropped from ready nodes' last heartbeats, by kind (out_of_bounds, at_source, unknown_gpu, gpu_power, node_power, bmc_low).",
)
PENDING_GAUGE = (
    "llmgw_node_inventory_pending", "GPUs its agent reports while a change of its inventory waits for an operator."
)
CONFLICTS_GAUGE = ("llmgw_node_location_conflicts", "Location labels its agent sends that the store's levels overrule.")
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


def _value(value: object) -> str | None:
    """A reading as a sample's value in the text format (as prometheus_client writes it), or None."""
    number = _number(value)
    if number is None:
        return None
    if number != number:
        return "NaN"
    if number in (math.inf, -math.inf):
        return "+Inf" if number > 0 else "-Inf"
    return repr(number)


def _label(text: str) -> str:
    """A label value escaped for the text format."""
    if "\\" in text or '"' in text or "\n" in text:
        return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return text


def _family(name: str, doc: str, samples: list[str]) -> str:
    """One gauge family in the text format: its HELP and TYPE lines, then ``name{labels} value`` each."""
    lines = "".join(f"{name}{sample}\n" for sample in samples)
    return f"# HELP {name} {doc}\n# TYPE {name} gauge\n{lines}"


def node_sensors_text() -> str:
    """llmgw_gpu_* and llmgw_node_* gauges from ready nodes' latest sensors, in Prometheus's text format.

    Written here rather than through a prometheus_client collector: at 10,000 nodes these are 750,000
    samples, and prometheus_client's exposition (each sample a named tuple, its labels validated and
    escaped one by one) is too slow for Prometheus's scrape timeout at that size, and holds the web
    process meanwhile.
    """
    from agents.models import Node, heartbeat_is_fresh
    from agents.node.protocol import IMPLAUSIBLE_KINDS, THROTTLE_REASONS

    now = timezone.now()
    gpu_samples: dict[str, list[str]] = {key: [] for _, key, _ in GPU_GAUGES}
    throttled: list[str] = []
    node_samples: dict[str, list[str]] = {key: [] for _, key, _ in NODE_GAUGES}
    implausible: list[str] = []
    kinds = dict.fromkeys(IMPLAUSIBLE_KINDS, 0)
    pending: list[str] = []
    conflicts: list[str] = []
    rows = (
        Node.objects.filter(last_heartbeat_at__isnull=False)
        .order_by("name")
        .values_list(
            "name", "last_heartbeat_at", "heartbeat_interval_seconds", "sensors", "location_conflicts",
            "pending_inventory",
        )
    )
    for name, last_at, interval, sensors, location_conflicts, pending_inventory in rows:
        node = _label(name)
        if isinstance(pending_inventory, list):  # a fact of the node, ready or not
            pending.append(f'{{node="{node}"}} {float(len(pending_inventory))!r}')
        if not heartbeat_is_fresh(last_at, interval, now) or not isinstance(sensors, dict):
            continue  # not ready: its readings are stale, so no series
        # Series only for a node flagged (as an absent reading is an absent series): `> 0` alerts alike.
        dropped = sensors.get("implausible")
        if isinstance(dropped, list) and dropped:
            implausible.append(f'{{node="{node}"}} {float(len(dropped))!r}')
            for entry in dropped:
                kind = entry.get("kind") if isinstance(entry, dict) else None
                if kind in kinds:
                    kinds[kind] += 1
        if isinstance(location_conflicts, list) and location_conflicts:
            conflicts.append(f'{{node="{node}"}} {float(len(location_conflicts))!r}')
        for key, samples in node_samples.items():
            value = _value(sensors.get(key))
            if value is not None:
                samples.append(f'{{node="{node}"}} {value}')
        for gpu in sensors.get("gpus") or []:
            if not isinstance(gpu, dict) or _number(gpu.get("index")) is None:
                continue
            labels = f'node="{node}",gpu="{_label(str(gpu["index"]))}",uuid="{_label(str(gpu.get("uuid") or ""))}"'
            for key, samples in gpu_samples.items():
                value = _value(gpu.get(key))
                if value is not None:
                    samples.append(f"{{{labels}}} {value}")
            reasons = gpu.get("throttle_reasons")
            if isinstance(reasons, list):  # absent: the agent could not read them, so no series
                for reason in THROTTLE_REASONS:
                    throttled.append(f'{{{labels},reason="{reason}"}} {"1.0" if reason in reasons else "0.0"}')
    families = [_family(name, doc, gpu_samples[key]) for name, key, doc in GPU_GAUGES]
    families.append(_family("llmgw_gpu_throttled", THROTTLED_DOC, throttled))
    families += [_family(name, doc, node_samples[key]) for name, key, doc in NODE_GAUGES]
    families.append(_family(*IMPLAUSIBLE_GAUGE, implausible))
    families.append(_family(*IMPLAUSIBLE_KINDS_GAUGE, [f'{{kind="{kind}"}} {float(n)!r}' for kind, n in kinds.items() if n]))
    families.append(_family(*PENDING_GAUGE, pending))
    families.append(_family(*CONFLICTS_GAUGE, conflicts))
    return "".join(families)


def metrics_token() -> str:
    """LLMGW_METRICS_TOKEN: when set, /metrics takes `Authorization: Bearer <it>` (and nothing else)."""
    return getattr(settings, "LLMGW_METRICS_TOKEN", None) or os.environ.get("LLMGW_METRICS_TOKEN", "")


def _is_viewer(request: HttpRequest) -> bool:
    """A logged-in viewer, or `Authorization: Token <key>` of a user with the viewer role."""
    from llmgw.access.authentication import TokenRefused, token_user
    from llmgw.permissions import can_read

    if can_read(getattr(request, "user", None)):
        return True
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "token" or not key.strip():
        return False
    try:  # the API's own check: an expired, rotated or revoked token is refused here too
        return can_read(token_user(key))
    except TokenRefused:
        return False


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
    response = ExportToDjangoView(request)  # the registry's metrics (the app's, domains', placement's)
    response.content = response.content + node_sensors_text().encode()
    return response
