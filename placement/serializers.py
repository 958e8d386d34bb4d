"""The API's bodies for models, replicas, explain and headroom, as serializers: what /api/v1/schema says.

The model document (request) is checked by placement.documents.parse_model_document; its serializer
here states the same keys and bounds for the schema.
"""

from __future__ import annotations

from rest_framework import serializers

from facility.response import LEVERS
from facility.serializers import MAX_FILE_CHARS, MAX_FILENAME, StrictSerializer
from llmgw.api import TextField
from placement import documents as d
from placement.documents import CLASS_CHOICES, KEEP_WITHIN_CHOICES, MAX_REPLICAS
from placement.topology import TOPOLOGY_CHOICES

REPLICA_STATES = ("pending", "placed", "starting", "ready", "failed", "stopping", "unreachable")


class ProfileSerializer(serializers.Serializer):
    gpus = serializers.IntegerField(
        min_value=0, max_value=d.MAX_GPUS_PER_NODE, help_text="GPUs per node; 0 for a CPU-only profile"
    )
    nodes = serializers.IntegerField(min_value=1, max_value=d.MAX_NODES_PER_REPLICA, required=False, default=1)
    cpu_cores = serializers.IntegerField(min_value=0, max_value=d.MAX_CPU_CORES, required=False, default=0)
    memory_gib = serializers.FloatField(min_value=0, max_value=d.MAX_MEMORY_GIB, required=False, default=0)
    power_watts = serializers.FloatField(
        min_value=0, max_value=d.MAX_POWER_WATTS, required=False, allow_null=True
    )
    keep_within = serializers.ChoiceField(choices=KEEP_WITHIN_CHOICES, required=False, allow_null=True)
    node_selector = serializers.CharField(
        max_length=d.MAX_SELECTOR_LENGTH, required=False, allow_null=True, allow_blank=True,
        help_text="e.g. `gpu.model in (H100,H200), llmgw.io/room=a`",
    )
    topology = serializers.ChoiceField(
        choices=TOPOLOGY_CHOICES, required=False, default="any",
        help_text="how a shard's GPUs must be joined on its node: any (the best set there is), nvlink-all, same-numa",
    )
    command = serializers.CharField(
        max_length=d.MAX_COMMAND_LENGTH, required=False, allow_null=True, allow_blank=True,
        help_text="no control characters",
    )
    health_path = serializers.CharField(
        max_length=d.MAX_HEALTH_PATH_LENGTH, required=False, allow_null=True, allow_blank=True
    )
    min_ready_seconds = serializers.IntegerField(
        min_value=0, max_value=d.MAX_MIN_READY_SECONDS, required=False, default=10
    )


class ModelDocumentSerializer(serializers.Serializer):
    """A `kind: Model` document, as `llmgw ctl apply` takes it in YAML."""

    kind = serializers.ChoiceField(choices=["Model"])
    name = serializers.RegexField(d.MODEL_NAME_RE.pattern.replace(r"\Z", "$"), max_length=d.MODEL_NAME_MAX_LENGTH)
    replicas = serializers.IntegerField(min_value=0, max_value=MAX_REPLICAS, required=False, default=1)
    profile = ProfileSerializer()

    def get_fields(self):
        # `class` is a Python keyword: the field is added under its document name.
        fields = super().get_fields()
        fields["class"] = serializers.ChoiceField(
            choices=CLASS_CHOICES, required=False, default="standard",
            help_text="what shedding moves first: batch, then standard; critical is never shed",
        )
        fields["min_ready"] = serializers.IntegerField(
            min_value=0, max_value=MAX_REPLICAS, required=False,
            help_text="ready replicas no drain, shed or cap takes the model below (default 1; at most replicas)",
        )
        return fields


class ProfileBodySerializer(serializers.Serializer):
    gpus = serializers.IntegerField()
    nodes = serializers.IntegerField()
    cpu_cores = serializers.IntegerField()
    memory_gib = serializers.FloatField()
    power_watts = serializers.FloatField(allow_null=True)
    keep_within = serializers.CharField(allow_null=True)
    node_selector = serializers.CharField(allow_null=True)
    topology = serializers.ChoiceField(choices=TOPOLOGY_CHOICES)
    command = serializers.CharField(allow_null=True)
    health_path = serializers.CharField(allow_blank=True)
    min_ready_seconds = serializers.IntegerField()


class ReplicaCountsSerializer(serializers.Serializer):
    desired = serializers.IntegerField()
    placed = serializers.IntegerField()
    ready = serializers.IntegerField()
    pending = serializers.IntegerField()
    failed = serializers.IntegerField()
    unreachable = serializers.IntegerField()


class EfficiencySerializer(serializers.Serializer):
    gpu_model = serializers.CharField()
    replicas = serializers.IntegerField(help_text="replicas measured")
    tokens_per_second = serializers.FloatField(help_text="mean generated tokens per second per replica")
    watts = serializers.FloatField(help_text="mean measured GPU power per replica")
    tokens_per_joule = serializers.FloatField()
    measured_at = serializers.DateTimeField()


class ModelRowSerializer(serializers.Serializer):
    name = serializers.CharField()
    replicas = ReplicaCountsSerializer()
    min_ready = serializers.IntegerField(help_text="ready replicas no drain, shed or cap takes it below")
    efficiency = EfficiencySerializer(many=True, help_text="measured per GPU model, most tokens per joule first")

    def get_fields(self):
        fields = super().get_fields()
        fields["class"] = serializers.ChoiceField(choices=CLASS_CHOICES)
        return fields
    profile = ProfileBodySerializer()
    error = serializers.CharField(
        allow_null=True, help_text="why the last reconcile could not place it (null once it places cleanly)"
    )
    error_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class ShardSerializer(serializers.Serializer):
    node = serializers.CharField()
    gpus = serializers.ListField(child=serializers.IntegerField(), help_text="GPU indices on the node")
    cpu_cores = serializers.IntegerField()
    memory_gib = serializers.FloatField()
    draw_watts = serializers.FloatField()
    state = serializers.CharField()
    port = serializers.IntegerField(allow_null=True)


class ReplicaSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    model = serializers.CharField()
    ordinal = serializers.IntegerField()
    state = serializers.ChoiceField(choices=REPLICA_STATES)
    nodes = serializers.ListField(child=serializers.CharField())
    shards = ShardSerializer(many=True)
    reason = serializers.CharField(allow_null=True)
    placed_at = serializers.DateTimeField(allow_null=True)
    ready_since = serializers.DateTimeField(allow_null=True)
    replaces = serializers.IntegerField(allow_null=True, help_text="the replica this one replaces, if any")


class ModelDetailSerializer(ModelRowSerializer):
    states = serializers.DictField(
        child=serializers.IntegerField(min_value=1),
        help_text="every replica counted by the state shown (a state none is in is left out)",
    )
    replica_list = ReplicaSerializer(
        many=True, help_text="the first 100 replicas by ordinal; every one: GET /replicas?model=NAME (paged)"
    )


class ModelAppliedSerializer(ModelDetailSerializer):
    action = serializers.ChoiceField(choices=["created", "updated", "unchanged"])
    warning = serializers.CharField(
        allow_null=True, help_text="a profile change its placed replicas do not take (they keep what they were placed with)"
    )


class RejectionSerializer(serializers.Serializer):
    node = serializers.CharField()
    reason = serializers.CharField()


class ExplainReplicaSerializer(ReplicaSerializer):
    """A replica and why it is where it is (placed) or why it waits (pending)."""

    summary = serializers.CharField(allow_null=True)
    rejections = RejectionSerializer(many=True, help_text="the first nodes passed over, kept at placing")
    conflicts = serializers.ListField(child=serializers.CharField(), help_text="lost races while committing")
    nodes_checked = serializers.IntegerField(allow_null=True, required=False, help_text="pending only")
    causes = serializers.ListField(
        child=serializers.CharField(), required=False,
        help_text="pending only: why it waits in words, the facility's causes first ('3 racks held: r1, r2, r3 (75 "
        "nodes)', '16 nodes lack gpu.model = H200'), every node counted",
    )
    why = serializers.CharField(allow_null=True, required=False, help_text="placed only")
    notes = serializers.ListField(
        child=serializers.CharField(), required=False,
        help_text="placed only: what thermal enforcement would have done (observe mode)",
    )
    passed_over = serializers.IntegerField(required=False, help_text="placed only")
    attempts = serializers.IntegerField(allow_null=True, required=False, help_text="placed only")


class ExplainSerializer(serializers.Serializer):
    model = serializers.CharField()
    desired = serializers.IntegerField()
    placed = serializers.IntegerField()
    pending = serializers.IntegerField()
    profile = ProfileBodySerializer()
    replicas_total = serializers.IntegerField(help_text="every replica of the model; `replicas` is a page of them")
    offset = serializers.IntegerField(help_text="the page's first replica, counted from 0 by ordinal")
    replicas = ExplainReplicaSerializer(many=True)


class HeadroomSerializer(serializers.Serializer):
    model = serializers.CharField()
    existing = serializers.IntegerField()
    fits = serializers.IntegerField()
    limit = serializers.IntegerField()
    why_not = serializers.CharField(allow_null=True, help_text="null when `fits` reached `limit`")


class RuleSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["filter", "scorer"])
    id = serializers.CharField()
    order = serializers.IntegerField(allow_null=True, help_text="a scorer's place in the ranking; null for a filter")
    builtin = serializers.BooleanField()
    words = serializers.CharField(help_text="what the rule does, in words")
    reads = serializers.ListField(
        child=serializers.CharField(), allow_null=True,
        help_text="the node's fields its answer rests on; null: not said (every plan then goes the plain path)",
    )
    rechecked = serializers.BooleanField(help_text="the commit asks it again of the node's locked row")


class RulesSerializer(serializers.Serializer):
    index = serializers.CharField(help_text="`kept`, or `plain path: <why>` when a rule does not say what it reads")
    rules = RuleSerializer(many=True)
    loaded = serializers.ListField(child=serializers.CharField(), help_text="the plugins loaded")
    errors = serializers.ListField(child=serializers.CharField(), help_text="plugins' failures, newest last")


class ModelsApplySerializer(StrictSerializer):
    text = TextField(max_length=MAX_FILE_CHARS, allow_blank=True, help_text="the models.yaml, whole: kind: Model documents")
    filename = TextField(
        max_length=MAX_FILENAME, required=False, default="models.yaml",
        help_text="named in refusals: `FILENAME line N: profile.gpus: …`",
    )


class ModelsAppliedSerializer(serializers.Serializer):
    models = ModelAppliedSerializer(many=True, help_text="each model of the file, in its order")


class ModelDeletedSerializer(serializers.Serializer):
    name = serializers.CharField()
    replicas_removed = serializers.IntegerField(help_text="its replicas, stopped and their GPUs freed")


class ShedMoveSerializer(serializers.Serializer):
    at = serializers.DateTimeField(help_text="when the move is due")
    domain = serializers.CharField(help_text="the domain in trouble")
    action = serializers.ChoiceField(choices=["move", "drop", "stays"])
    replica = serializers.CharField(allow_null=True, help_text="model#ordinal; null: nothing there may move")
    replica_id = serializers.IntegerField(allow_null=True)
    model = serializers.CharField(allow_null=True)
    to = serializers.ListField(child=serializers.CharField(), help_text="the replacement's nodes (move)")
    reason = serializers.CharField()

    def get_fields(self):
        fields = super().get_fields()
        fields["class"] = serializers.ChoiceField(choices=CLASS_CHOICES, allow_null=True)
        return fields


class ShedListingSerializer(serializers.Serializer):
    enabled = serializers.BooleanField(help_text="facility.shedding is on for some domain")
    moves = ShedMoveSerializer(many=True)


class CappingNodeSerializer(serializers.Serializer):
    node = serializers.CharField()
    state = serializers.ChoiceField(choices=["capped", "would cap"], help_text="would cap: observe mode")
    fraction = serializers.FloatField(help_text="of the GPUs' default limit")
    limit = serializers.CharField(help_text="490 W, or 1386 MHz with locked clocks")
    reason = serializers.CharField(allow_blank=True)
    text = serializers.CharField()
    lever = serializers.ChoiceField(choices=LEVERS)


class CappingListingSerializer(serializers.Serializer):
    enabled = serializers.BooleanField(help_text="facility.capping.enabled")
    lever = serializers.ChoiceField(choices=LEVERS)
    nodes = CappingNodeSerializer(many=True)
