"""The API's bodies for nodes and heartbeats, as serializers: what /api/v1/schema says they are."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from agents.filtersets import STATES
from agents.node.protocol import MAX_LABEL_VALUE_LENGTH, MAX_LABELS
from facility.serializers import StrictBooleanField, StrictSerializer
from llmgw.api import TextField, WordsField


class HoldRefSerializer(serializers.Serializer):
    domain = serializers.CharField()
    reason = serializers.CharField()


class GpuCountSerializer(serializers.Serializer):
    free = serializers.IntegerField()
    total = serializers.IntegerField()


class NodeRowSerializer(serializers.Serializer):
    """One node in the list: state, free GPUs, location and domains."""

    name = serializers.CharField()
    state = serializers.ChoiceField(choices=STATES)
    ready = serializers.BooleanField()
    cordoned = serializers.BooleanField()
    held = HoldRefSerializer(allow_null=True, help_text="the hold the node is in, if any")
    gpus = GpuCountSerializer()
    location = serializers.DictField(child=serializers.CharField(), help_text="level → name, e.g. rack → r12-07")
    domains = serializers.ListField(child=serializers.CharField())
    fabric = serializers.CharField(allow_null=True)
    last_heartbeat_at = serializers.DateTimeField(allow_null=True)
    warnings = serializers.ListField(
        child=serializers.CharField(),
        help_text="what of its agent's word was not taken: location labels of store-only levels that differ from "
        "the store's, readings the node cannot have read, a change of its GPUs waiting for an operator",
    )


class LabelSourceSerializer(serializers.Serializer):
    key = serializers.CharField()
    value = serializers.CharField()
    source = serializers.ChoiceField(
        choices=["store", "agent", "ignored"],
        help_text="store wins over agent; ignored: the agent's, not taken (the level is the store's: location_from)",
    )
    agent_value = serializers.CharField(allow_null=True)


class GpuSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    uuid = serializers.CharField(allow_blank=True)
    model = serializers.CharField(allow_blank=True)
    memory_gib = serializers.FloatField(allow_null=True)
    power_limit_watts = serializers.FloatField(allow_null=True)
    present = serializers.BooleanField()
    replica = serializers.IntegerField(allow_null=True, help_text="the replica using it, if any")
    replica_name = serializers.CharField(allow_null=True, help_text="that replica as ctl replicas names it: model#ordinal")


class GpuTopologySerializer(serializers.Serializer):
    links = serializers.ListField(
        child=serializers.ListField(child=serializers.CharField(allow_null=True)),
        help_text="GPU × GPU, by index: X (itself), NV# (# NVLinks), PIX, PXB, PHB, NODE, SYS; null: unknown",
    )
    numa = serializers.ListField(
        child=serializers.IntegerField(allow_null=True), help_text="each GPU's NUMA node (-1: the platform has one)"
    )


class BmcStatusSerializer(serializers.Serializer):
    state = serializers.ChoiceField(choices=["up", "down"])
    reason = serializers.CharField(required=False, help_text="why it is down")
    resource = serializers.CharField(required=False, help_text="where the figure was read: EnvironmentMetrics, …")


class InventoryPendingSerializer(serializers.Serializer):
    gpus = serializers.ListField(child=serializers.DictField(), help_text="the GPUs its agent reports")
    since = serializers.DateTimeField(allow_null=True)
    known = serializers.IntegerField(help_text="how many GPUs are known (gpu_list's present ones)")
    changes = serializers.ListField(child=serializers.CharField(), help_text="a line per GPU that differs")


class InventoryAcceptSerializer(serializers.Serializer):
    node = serializers.CharField()
    gpus = serializers.IntegerField(help_text="its GPUs now")


class NodeDetailSerializer(NodeRowSerializer):
    """One node whole: labels with their sources, GPUs and the last sensors."""

    labels = LabelSourceSerializer(many=True)
    cpu_cores = serializers.IntegerField(allow_null=True)
    memory_gib = serializers.FloatField(allow_null=True)
    cordon_reason = serializers.CharField(allow_null=True)
    gpu_list = GpuSerializer(many=True)
    sensors = serializers.DictField(
        allow_null=True,
        help_text="the agent's last readings as they were taken; `implausible`: those dropped, each "
        "{reading: its field, value, why, kind: out_of_bounds|at_source|unknown_gpu|gpu_power|node_power|bmc_low}",
    )
    location_conflicts = serializers.ListField(
        child=serializers.CharField(),
        help_text="what the agent says of the location that is not taken: the level is the store's (location_from)",
    )
    sensors_at = serializers.DateTimeField(allow_null=True)
    measured_watts = serializers.FloatField(allow_null=True)
    measured_peak_watts = serializers.FloatField(
        allow_null=True,
        help_text="the draw power accounting counts: the second-highest reading of the measured window (null: "
        "fewer than two readings in it)",
    )
    max_draw_watts = serializers.FloatField(
        allow_null=True, help_text="the most the node can draw, where set (its PSUs' rating, a DCIM's maximum draw)"
    )
    inventory_pending = InventoryPendingSerializer(
        allow_null=True,
        help_text="a change of GPUs its agent reports that waits for an operator (POST …/inventory/accept); "
        "until then placement keeps `gpu_list` and only those cards' readings count",
    )
    placed_watts = serializers.FloatField(allow_null=True)
    gpu_topology = GpuTopologySerializer(
        allow_null=True, help_text="how its GPUs are wired, as `nvidia-smi topo -m` shows it; null: not reported"
    )
    power_source = serializers.ChoiceField(
        choices=["bmc", "gpu+cpu"], allow_null=True,
        help_text="what its measured draw comes from: the chassis' power read from its BMC (Redfish), or its GPUs' "
        "and CPUs' own readings; null: nothing read",
    )
    bmc_watts = serializers.FloatField(
        allow_null=True, help_text="the chassis' draw its BMC last read, while the BMC is the source (W)"
    )
    bmc = BmcStatusSerializer(allow_null=True, help_text="its BMC as a power source (agent.yaml bmc:); null: none")


@extend_schema_field(
    {
        "type": "object",
        "minProperties": 1,
        "maxProperties": MAX_LABELS,
        "additionalProperties": {"type": "string", "nullable": True, "minLength": 1, "maxLength": MAX_LABEL_VALUE_LENGTH},
    }
)
class LabelChangesField(serializers.DictField):
    """key → value or null; at least one, at most MAX_LABELS (refused before any is read)."""

    def to_internal_value(self, data):
        if isinstance(data, dict) and len(data) > MAX_LABELS:
            raise serializers.ValidationError(f"at most {MAX_LABELS} in one change (got {len(data):,})")
        return super().to_internal_value(data)


class LabelsSerializer(StrictSerializer):
    labels = LabelChangesField(
        child=TextField(allow_null=True, allow_blank=False, max_length=MAX_LABEL_VALUE_LENGTH),
        allow_empty=False,
        help_text="key → value to set, key → null to remove the store's value (back to the agent's).",
    )


class LabelsResultSerializer(serializers.Serializer):
    node = serializers.CharField()
    labels = serializers.DictField(child=serializers.CharField(), help_text="the node's effective labels now")
    warning = serializers.CharField(
        allow_null=True,
        help_text="a location no node was in (a typo?, with the nearest known names) or a limit the node's draw passes",
    )


class CordonSerializer(StrictSerializer):
    cordoned = StrictBooleanField(help_text="true: nothing new is placed on the node; false: place on it again")
    drain = StrictBooleanField(default=False, help_text="also move its replicas out, the replacement up first")
    reason = WordsField(default="", allow_blank=True, max_length=500, help_text="why, shown with the node")


class CordonResultSerializer(serializers.Serializer):
    node = serializers.CharField()
    cordoned = serializers.BooleanField()
    draining = serializers.BooleanField()
    warning = serializers.CharField(
        allow_null=True, required=False,
        help_text="a drain's replica that fits nowhere else now, a domain its drain takes past its limit, "
        "or a drain an uncordon stops",
    )


class NodeTokenSerializer(serializers.Serializer):
    node = serializers.CharField()
    token = serializers.CharField(help_text="the agent's token (agent.yaml token: or token_file); only its hash is kept")


class HeartbeatRequestSchema(serializers.Serializer):
    """For the OpenAPI schema only: the checks are agents.node.protocol.validate_heartbeat."""

    node = serializers.CharField()
    agent_version = serializers.CharField(required=False)
    interval_seconds = serializers.FloatField(required=False, help_text="at most 10")
    inventory = serializers.DictField(required=False, help_text="gpus [{index, uuid, name, memory_gib, "
                                      "power_limit_watts, power_limit_max_watts}], cpu_cores, memory_gib, hostname, "
                                      "fabric, max_draw_watts (the node's ceiling: its PSUs' rating), "
                                      "gpu_topology {links: GPU × GPU of X|NV#|PIX|PXB|PHB|NODE|SYS|null, "
                                      "numa: [node|-1|null]}")
    labels = serializers.DictField(child=serializers.CharField(), required=False)
    sensors = serializers.DictField(required=False, help_text="gpus [{index, uuid, temperature_celsius, "
                                    "memory_temperature_celsius, slowdown_temperature_celsius, power_watts, power_limit_watts, "
                                    "throttle_reasons, enforced_power_limit_watts, default_power_limit_watts, max_sm_clock_mhz, "
                                    "locked_clocks_mhz, capping: not permitted|not supported}], "
                                    "cpu_temperature_celsius, inlet_temperature_celsius, cpu_power_watts, "
                                    "replicas [{id, tokens_per_second}], node_power_watts with power_source: bmc, "
                                    "bmc {state: up|down, reason, resource}")
    replicas = serializers.ListField(child=serializers.DictField(), required=False,
                                     help_text="[{id, state: starting|ready|stopping|failed, port, restarts, message}]")


class AssignmentSerializer(serializers.Serializer):
    """A replica the node must run."""

    id = serializers.IntegerField()
    model = serializers.CharField()
    command = serializers.CharField(allow_blank=True)
    health_path = serializers.CharField()
    gpus = serializers.ListField(child=serializers.IntegerField())
    cpu_cores = serializers.IntegerField()
    memory_gib = serializers.FloatField()


class GpuCapSerializer(serializers.Serializer):
    """What a GPU must hold: the value of the block's lever."""

    uuid = serializers.CharField(required=False, help_text="in `gpus` only: the GPU it is for")
    power_limit_watts = serializers.FloatField(required=False, help_text="lever power_limit")
    locked_clocks_mhz = serializers.ListField(
        child=serializers.IntegerField(), min_length=2, max_length=2, required=False,
        help_text="lever locked_clocks: [min, max] SM clock, MHz",
    )


class CappingSerializer(serializers.Serializer):
    """The GPU capping a node must hold (agents.node.protocol.validate_capping); absent: every GPU's defaults."""

    lever = serializers.ChoiceField(choices=["power_limit", "locked_clocks"])
    all = GpuCapSerializer(required=False, help_text="every GPU not listed in `gpus`")
    gpus = GpuCapSerializer(many=True, required=False)


class HeartbeatAnswerSerializer(serializers.Serializer):
    node = serializers.CharField()
    interval_seconds = serializers.FloatField()
    replicas = AssignmentSerializer(many=True)
    capping = CappingSerializer(required=False, help_text="absent: every GPU back to its defaults")
    warnings = serializers.ListField(
        child=serializers.CharField(), required=False,
        help_text="what of the heartbeat was not taken, its field named (readings the node cannot have read)",
    )
