"""Nodes as their agents report them, the labels the store keeps for them, and their tokens."""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from datetime import datetime

from django.conf import settings
from django.db import models
from django.utils import timezone

from facility.domains import LABEL_PREFIX
from facility.power import fresh_measured_watts, measured_peak


def ready_window_seconds(interval_seconds: float) -> float:
    """How long a node stays ready after a heartbeat: LLMGW_MISSED_HEARTBEATS of its intervals."""
    return interval_seconds * settings.LLMGW_MISSED_HEARTBEATS


def heartbeat_is_fresh(last_heartbeat_at: datetime | None, interval_seconds: float, now: datetime) -> bool:
    """The one rule of node readiness: a heartbeat within the ready window (never heard of: not ready)."""
    if last_heartbeat_at is None:
        return False
    return (now - last_heartbeat_at).total_seconds() <= ready_window_seconds(interval_seconds)


# server.yaml's facility.measured_window, read through a function the facility app registers in its ready()
# (this layer may not import facility's models); cached briefly since every heartbeat asks.
_measured_window_reader: Callable[[], float | None] | None = None
_measured_window_cache: tuple[float | None, float] | None = None  # (value, monotonic time it expires)
MEASURED_WINDOW_CACHE_SECONDS = 10.0


def register_measured_window_reader(reader: Callable[[], float | None]) -> None:
    """Set the function that reads the configured window in seconds (None: not configured)."""
    global _measured_window_reader
    _measured_window_reader = reader
    forget_measured_window()


def forget_measured_window() -> None:
    """Drop the cached window (the settings row changed)."""
    global _measured_window_cache
    _measured_window_cache = None


def measured_window_seconds() -> float:
    """The window of a node's measured peak: server.yaml facility.measured_window where set, else
    LLMGW_MEASURED_WINDOW_SECONDS (default 15 minutes)."""
    global _measured_window_cache
    now = time.monotonic()
    if _measured_window_cache is None or _measured_window_cache[1] <= now:
        value = _measured_window_reader() if _measured_window_reader is not None else None
        _measured_window_cache = (value, now + MEASURED_WINDOW_CACHE_SECONDS)
    value = _measured_window_cache[0]
    return settings.LLMGW_MEASURED_WINDOW_SECONDS if value is None else value


def measured_peak_of(buckets, watts: float | None, at: datetime) -> tuple[list[list[float]], float | None]:
    """The node's peak buckets and peak once a reading taken at ``at`` is added: the one rule, for every writer."""
    return measured_peak(buckets or [], watts, at.timestamp(), measured_window_seconds())


def measured_fresh_seconds() -> float:
    """How long a node's measured draw counts for power accounting (LLMGW_MEASURED_FRESH_SECONDS)."""
    return settings.LLMGW_MEASURED_FRESH_SECONDS


class Node(models.Model):
    """A GPU (or CPU) machine running `llmgw agent`, known by name."""

    name = models.CharField(max_length=253, unique=True)
    hostname = models.CharField(max_length=253, blank=True)
    fabric = models.CharField(
        max_length=253, blank=True, help_text="The NVLink/InfiniBand group a multi-node replica stays inside."
    )
    cpu_cores = models.PositiveIntegerField(default=0)
    memory_gib = models.FloatField(default=0)
    gpu_topology = models.JSONField(
        default=dict, blank=True,
        help_text="How its GPUs are wired, as its agent reports it (agents.node.protocol's gpu_topology): "
        '{"links": GPU × GPU matrix of NV#/PIX/PXB/PHB/NODE/SYS, "numa": each GPU\'s NUMA node}; {}: not reported.',
    )
    agent_labels = models.JSONField(default=dict, blank=True, help_text="Labels from the node's agent.yaml.")
    labels = models.JSONField(default=dict, blank=True, help_text="Effective labels: the store's over the agent's.")
    location_conflicts = models.JSONField(
        default=list, blank=True,
        help_text="What the agent says of the node's location that is ignored, the level being the store's "
        "(server.yaml facility.location_from), and the store says otherwise.",
    )
    cordoned = models.BooleanField(default=False)
    cordon_reason = models.CharField(max_length=500, blank=True)
    draining = models.BooleanField(default=False, help_text="Drained: its replicas move out, replacement first.")
    agent_version = models.CharField(max_length=50, blank=True)
    heartbeat_interval_seconds = models.FloatField(default=10)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    sensors = models.JSONField(default=dict, blank=True, help_text="The latest sensor readings.")
    sensors_at = models.DateTimeField(null=True, blank=True)
    measured_watts = models.FloatField(
        null=True, blank=True,
        help_text="Draw beyond node_watts last read: GPU + CPU packages, or its BMC's whole-chassis figure less node_watts.",
    )
    # The rolling peak power accounting counts (facility.power.measured_peak): the second-highest reading
    # of the last measured window (one sample never holds it), kept as [[bucket start epoch, highest,
    # second], ...] so each write is cheap.
    measured_peak_watts = models.FloatField(
        null=True, blank=True,
        help_text="Second-highest draw read in the last measured window (empty: fewer than two readings in it).",
    )
    measured_peaks = models.JSONField(default=list, blank=True, help_text="Peak buckets of the measured window.")
    # What the last heartbeat said of everything but its sensors: a heartbeat that says the same again
    # takes the fast path (one UPDATE of the readings).
    report_digest = models.CharField(max_length=32, blank=True)
    weights = models.JSONField(default=list, blank=True, help_text="Models whose weights the node holds.")
    max_draw_watts = models.FloatField(
        null=True, blank=True,
        help_text="The most the whole node can draw (its PSUs' rating, a DCIM's maximum draw): a reading of the "
        "node above it is dropped as implausible. Empty: its agent's declared figure, else a loose bound.",
    )
    # A change of its cards its heartbeat reports waits here for an operator (inventory_accept): until then
    # the node keeps its known cards for placement and its readings count only for them.
    pending_inventory = models.JSONField(
        null=True, blank=True,
        help_text="The cards its heartbeat reports that differ from its known ones (count, model, UUIDs), "
        "waiting for an operator's accept-inventory; empty: none.",
    )
    inventory_pending_since = models.DateTimeField(null=True, blank=True)
    inventory_open = models.BooleanField(
        default=False, help_text="Its next heartbeat's cards are taken as they are (the node re-registered)."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def is_ready(self, now=None) -> bool:
        """Ready while heartbeats are fresh (:func:`heartbeat_is_fresh`)."""
        return heartbeat_is_fresh(self.last_heartbeat_at, self.heartbeat_interval_seconds, now or timezone.now())

    def fresh_measured_watts(self, now=None) -> float | None:
        """The measured draw while it counts (:func:`facility.power.fresh_measured_watts`), else None."""
        return fresh_measured_watts(
            self.measured_peak_watts, self.sensors_at, now or timezone.now(), measured_fresh_seconds()
        )

    def location(self) -> dict[str, str]:
        return {k: v for k, v in self.labels.items() if k.startswith(LABEL_PREFIX)}


class GPU(models.Model):
    """One card of a node, as NVML reports it (who has it booked is placement's: its GPU bookings)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveIntegerField()
    uuid = models.CharField(max_length=100, blank=True)
    model = models.CharField(max_length=200, blank=True)
    memory_gib = models.FloatField(null=True, blank=True)
    power_limit_watts = models.FloatField(null=True, blank=True)
    power_limit_max_watts = models.FloatField(
        null=True, blank=True, help_text="The highest limit the card can be set to: the most it can draw."
    )
    present = models.BooleanField(default=True, help_text="False once the agent stops reporting it.")

    class Meta:
        ordering = ["node", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_index_per_node")]

    def __str__(self) -> str:
        return f"{self.node.name}/gpu{self.index}"


class StoreLabel(models.Model):
    """A label set through ctl, the API or the console; wins over the agent's; may precede the node."""

    node_name = models.CharField(max_length=253, db_index=True)
    key = models.CharField(max_length=253)
    value = models.CharField(max_length=253)
    set_by = models.CharField(max_length=150, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["node_name", "key"]
        constraints = [models.UniqueConstraint(fields=["node_name", "key"], name="store_label_unique_key")]

    def __str__(self) -> str:
        return f"{self.node_name}: {self.key}={self.value}"


class NodeDomain(models.Model):
    """Which domains a node's effective labels put it in; derived, rewritten with its labels."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="domains")
    domain = models.CharField(max_length=300, db_index=True)
    level = models.CharField(max_length=8)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "domain"], name="node_domain_unique")]

    def __str__(self) -> str:
        return f"{self.node_id} in {self.domain}"


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class NodeToken(models.Model):
    """The credential a node's agent sends; it writes that node only. Only a hash is kept."""

    node_name = models.CharField(max_length=253, unique=True)
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"token of {self.node_name}"

    @staticmethod
    def hash_key(key: str) -> str:
        return _hash(key)

    @staticmethod
    def new_key() -> str:
        return "node_" + secrets.token_urlsafe(32)
