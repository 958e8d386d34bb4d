"""REST API of nodes: list and detail, store labels, and the agents' heartbeat."""

from __future__ import annotations

import json
import math

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ParseError, PermissionDenied
from rest_framework.permissions import BasePermission
from rest_framework.response import Response
from rest_framework.views import APIView

from agents import selectors, services
from agents.authentication import NodeIdentity, NodeTokenAuthentication
from agents.models import Node
from facility.domains import DomainError, parse_domain
from llmgw.errors import InvalidInput

THROTTLE_REASONS = ("sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "power_brake")
REPLICA_STATES = ("starting", "ready", "stopping", "failed")


# -- nodes -----------------------------------------------------------------------------------------------


class NodeListView(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("domain", str, description="Only nodes in this domain, e.g. rack:r12-07")],
        responses={200: dict},
        operation_id="nodes_list",
        summary="Nodes with state, free GPUs and location",
    )
    def get(self, request):
        domain = request.query_params.get("domain")
        if domain:
            try:
                domain = str(parse_domain(domain))
            except DomainError as exc:
                raise InvalidInput(f"domain: {exc}", field="domain") from exc
        return Response([row.as_dict() for row in selectors.node_rows(domain=domain)])


def node_detail(node: Node) -> dict:
    row = selectors.node_rows(selectors.node_queryset().filter(pk=node.pk))[0]
    body = row.as_dict()
    body.update(
        {
            "labels": selectors.node_label_sources(node.name, node.agent_labels or {}),
            "cpu_cores": node.cpu_cores,
            "memory_gib": node.memory_gib,
            "cordon_reason": node.cordon_reason or None,
            "gpu_list": [
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "model": g.model,
                    "memory_gib": g.memory_gib,
                    "power_limit_watts": g.power_limit_watts,
                    "present": g.present,
                    "replica": g.shard.replica_id if g.shard_id else None,
                }
                for g in node.gpus.select_related("shard").all()
            ],
            "sensors": node.sensors,
            "sensors_at": node.sensors_at.isoformat() if node.sensors_at else None,
            "measured_watts": node.measured_watts,
            "placed_watts": node.placed_watts,
        }
    )
    return body


class NodeDetailView(APIView):
    @extend_schema(responses={200: dict}, summary="One node: location with label sources, hold, GPUs, sensors")
    def get(self, request, name: str):
        node = Node.objects.filter(name=name).first()
        if node is None:
            raise NotFound(f"node {name!r} is not known")
        return Response(node_detail(node))


class LabelsSerializer(serializers.Serializer):
    labels = serializers.DictField(
        child=serializers.CharField(allow_null=True, allow_blank=False, max_length=253),
        allow_empty=False,
        help_text="key → value to set, key → null to remove the store's value (back to the agent's).",
    )


class NodeLabelsView(APIView):
    @extend_schema(request=LabelsSerializer, responses={200: dict}, summary="Set or remove store labels")
    def post(self, request, name: str):
        data = LabelsSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        labels = services.labels_set(
            node_name=name, changes=data.validated_data["labels"], set_by=request.user.get_username()
        )
        return Response({"node": name, "labels": labels})


# -- heartbeats ------------------------------------------------------------------------------------------


def finite(value: float) -> float:
    if not math.isfinite(value):
        raise serializers.ValidationError("must be a finite number")
    return value


class GPUInventorySerializer(serializers.Serializer):
    index = serializers.IntegerField(min_value=0, max_value=63)
    uuid = serializers.CharField(max_length=100, required=False, allow_blank=True)
    name = serializers.CharField(max_length=200, required=False, allow_blank=True)
    memory_gib = serializers.FloatField(min_value=0, max_value=4096, required=False, validators=[finite])
    power_limit_watts = serializers.FloatField(min_value=0, max_value=5000, required=False, validators=[finite])


class InventorySerializer(serializers.Serializer):
    gpus = GPUInventorySerializer(many=True, required=False, max_length=64)
    cpu_cores = serializers.IntegerField(min_value=0, max_value=16384, required=False)
    memory_gib = serializers.FloatField(min_value=0, max_value=1_048_576, required=False, validators=[finite])
    hostname = serializers.CharField(max_length=253, required=False, allow_blank=True)
    fabric = serializers.CharField(max_length=253, required=False, allow_blank=True, allow_null=True)

    def validate_gpus(self, gpus):
        indices = [g["index"] for g in gpus]
        if len(set(indices)) != len(indices):
            raise serializers.ValidationError("two GPUs with one index")
        return gpus


def temperature(**kw):
    return serializers.FloatField(min_value=-40, max_value=150, required=False, validators=[finite], **kw)


class GPUSensorSerializer(serializers.Serializer):
    index = serializers.IntegerField(min_value=0, max_value=63)
    uuid = serializers.CharField(max_length=100, required=False, allow_blank=True)
    temperature_celsius = temperature()
    memory_temperature_celsius = temperature()
    power_watts = serializers.FloatField(min_value=0, max_value=5000, required=False, validators=[finite])
    power_limit_watts = serializers.FloatField(min_value=0, max_value=5000, required=False, validators=[finite])
    throttle_reasons = serializers.ListField(
        child=serializers.ChoiceField(choices=THROTTLE_REASONS), required=False, max_length=len(THROTTLE_REASONS)
    )


class SensorsSerializer(serializers.Serializer):
    gpus = GPUSensorSerializer(many=True, required=False, max_length=64)
    cpu_temperature_celsius = temperature()
    inlet_temperature_celsius = temperature()
    cpu_power_watts = serializers.FloatField(min_value=0, max_value=20000, required=False, validators=[finite])


class ReplicaStateSerializer(serializers.Serializer):
    id = serializers.IntegerField(min_value=1)
    state = serializers.ChoiceField(choices=REPLICA_STATES)
    port = serializers.IntegerField(min_value=1, max_value=65535, required=False, allow_null=True)
    pid = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    restarts = serializers.IntegerField(min_value=0, required=False)
    message = serializers.CharField(max_length=1000, required=False, allow_blank=True)


class HeartbeatSerializer(serializers.Serializer):
    node = serializers.CharField(max_length=253)
    agent_version = serializers.CharField(max_length=50, required=False, allow_blank=True)
    interval_seconds = serializers.FloatField(min_value=0.1, max_value=10, required=False, validators=[finite])
    inventory = InventorySerializer(required=False)
    labels = serializers.DictField(child=serializers.CharField(max_length=253, allow_blank=True), required=False)
    sensors = SensorsSerializer(required=False)
    replicas = ReplicaStateSerializer(many=True, required=False, max_length=1024)

    def validate_labels(self, labels):
        from facility.domains import validate_label

        for key, value in labels.items():
            try:
                validate_label(key, value)
            except DomainError as exc:
                raise serializers.ValidationError(str(exc)) from exc
        return labels


def _strip_nulls(value):
    """An absent reading may arrive as null: treat it as absent, never as zero."""
    if isinstance(value, dict):
        return {k: _strip_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_nulls(v) for v in value]
    return value


class IsNode(BasePermission):
    message = "this endpoint takes a node token (llmgw ctl node token NODE)"

    def has_permission(self, request, view) -> bool:
        return isinstance(request.user, NodeIdentity)


class HeartbeatView(APIView):
    """POST /api/v1/agents/heartbeat: what a node reports; the answer is what it must run."""

    authentication_classes = [NodeTokenAuthentication]
    permission_classes = [IsNode]

    @extend_schema(request=HeartbeatSerializer, responses={200: dict}, summary="An agent's heartbeat")
    def post(self, request):
        length = int(request.META.get("CONTENT_LENGTH") or 0)
        if length > settings.LLMGW_HEARTBEAT_MAX_BYTES:
            raise ParseError(f"heartbeat: {length} bytes is over the {settings.LLMGW_HEARTBEAT_MAX_BYTES}-byte limit")
        try:
            payload = _strip_nulls(request.data)
        except (json.JSONDecodeError, ParseError) as exc:
            raise ParseError(f"heartbeat: not JSON: {exc}") from exc
        data = HeartbeatSerializer(data=payload)
        data.is_valid(raise_exception=True)
        heartbeat = data.validated_data
        if heartbeat["node"] != request.user.node_name:
            raise PermissionDenied(
                f"node: this token belongs to {request.user.node_name!r}; it cannot write {heartbeat['node']!r}"
            )
        node = services.heartbeat_record(node_name=heartbeat["node"], heartbeat=heartbeat)
        from placement.selectors import node_assignments

        return Response(
            {
                "node": node.name,
                "interval_seconds": node.heartbeat_interval_seconds,
                "replicas": node_assignments(node),
            },
            status=status.HTTP_200_OK,
        )
