"""REST API of nodes: list and detail, store labels, and the agents' heartbeat."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.permissions import BasePermission
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from agents import readings, selectors, services
from agents.authentication import NodeIdentity, NodeTokenAuthentication
from agents.models import Node
from agents.node.protocol import HeartbeatError, validate_heartbeat
from facility import nodes as facility_nodes
from facility.domains import DomainError, parse_domain
from llmgw.errors import InvalidInput
from llmgw.parsers import BoundedJSONParser

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
        return Response([row.as_dict() for row in facility_nodes.node_rows(domain=domain)])


def node_detail(node: Node) -> dict:
    row = facility_nodes.node_rows(selectors.node_queryset().filter(pk=node.pk))[0]
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


class IsNode(BasePermission):
    message = "this endpoint takes a node token (llmgw ctl node token NODE)"

    def has_permission(self, request, view) -> bool:
        return isinstance(request.user, NodeIdentity)


class HeartbeatRequestSchema(serializers.Serializer):
    """For the OpenAPI schema only: the checks are agents.node.protocol.validate_heartbeat."""

    node = serializers.CharField()
    agent_version = serializers.CharField(required=False)
    interval_seconds = serializers.FloatField(required=False, help_text="at most 10")
    inventory = serializers.DictField(required=False, help_text="gpus [{index, uuid, name, memory_gib, "
                                      "power_limit_watts}], cpu_cores, memory_gib, hostname, fabric")
    labels = serializers.DictField(child=serializers.CharField(), required=False)
    sensors = serializers.DictField(required=False, help_text="gpus [{index, uuid, temperature_celsius, "
                                    "memory_temperature_celsius, power_watts, power_limit_watts, throttle_reasons}], "
                                    "cpu_temperature_celsius, inlet_temperature_celsius, cpu_power_watts")
    replicas = serializers.ListField(child=serializers.DictField(), required=False,
                                     help_text="[{id, state: starting|ready|stopping|failed, port, restarts, message}]")


class HeartbeatView(APIView):
    """POST /api/v1/agents/heartbeat: what a node reports; the answer is what it must run."""

    authentication_classes = [NodeTokenAuthentication]
    permission_classes = [IsNode]
    parser_classes = [BoundedJSONParser]
    renderer_classes = [JSONRenderer]

    @extend_schema(request=HeartbeatRequestSchema, responses={200: dict}, summary="An agent's heartbeat")
    def post(self, request):
        length = int(request.META.get("CONTENT_LENGTH") or 0)
        if length > settings.LLMGW_HEARTBEAT_MAX_BYTES:
            raise InvalidInput(
                f"heartbeat: {length} bytes is over the {settings.LLMGW_HEARTBEAT_MAX_BYTES}-byte limit", field="heartbeat"
            )
        try:
            heartbeat = validate_heartbeat(request.data)
        except HeartbeatError as exc:
            raise InvalidInput(exc.message, field=exc.field) from exc
        if heartbeat["node"] != request.user.node_name:
            raise PermissionDenied(
                f"node: this token belongs to {request.user.node_name!r}; it cannot write {heartbeat['node']!r}"
            )
        services.heartbeat_record(node_name=heartbeat["node"], heartbeat=heartbeat)
        # From the map of every node's assignments, read at most once a second (and at once after a
        # placement change in this process): the answer the fast lane gives too.
        replicas = readings.assignments(heartbeat["node"])
        return Response(
            {"node": heartbeat["node"], "interval_seconds": heartbeat.get("interval_seconds", 10), "replicas": replicas},
            status=status.HTTP_200_OK,
        )
