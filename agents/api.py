"""REST API of nodes: list and detail, store labels, and the agents' heartbeat."""

from __future__ import annotations

import json

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter
from rest_framework import status
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import BasePermission
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from agents import readings, selectors, services
from agents.authentication import NodeIdentity, NodeTokenAuthentication
from agents.filtersets import MAX_TERMS, STATES, filter_pattern, nodes_filtered
from agents.models import Node
from agents.node.protocol import HeartbeatError, validate_heartbeat, value_shown
from agents.serializers import (
    CordonResultSerializer,
    CordonSerializer,
    HeartbeatAnswerSerializer,
    HeartbeatRequestSchema,
    InventoryAcceptSerializer,
    LabelsResultSerializer,
    LabelsSerializer,
    NodeDetailSerializer,
    NodeRowSerializer,
    NodeTokenSerializer,
)
from facility import nodes as facility_nodes
from llmgw.api import STORABLE_TEXT_PATTERN, ApiView, documented
from llmgw.errors import InvalidInput, NotFound
from llmgw.parsers import BoundedJSONParser
from llmgw.permissions import IsAdmin
from llmgw.remote import SUGGESTIONS_HEADER
from placement import selectors as placement_selectors
from placement import services as placement_services

# -- nodes -----------------------------------------------------------------------------------------------


class NodeListView(ApiView):
    @documented(
        summary="Nodes with state, free GPUs and location",
        ok={200: NodeRowSerializer(many=True)},
        parameters=[
            OpenApiParameter(
                "domain", str, pattern=filter_pattern(),
                description="Only nodes in this domain (rack:r12-07, any level), in the rack of this name (r12-07) "
                "or with this label (gpu.model=H200); several separated by spaces: those of one level or label key "
                f"are any of them, different ones all hold (at most {MAX_TERMS})",
            ),
            OpenApiParameter("state", str, enum=[*STATES, ""], description="Only nodes in this state (empty: any)"),
            OpenApiParameter(
                "q", str, pattern=STORABLE_TEXT_PATTERN, description="Only nodes whose name contains this"
            ),
            OpenApiParameter(
                SUGGESTIONS_HEADER, str, OpenApiParameter.HEADER, response=[200],
                description="On an empty answer to a `domain` term no node has: JSON, what it could have meant "
                '(`[{"term": "r12-7", "text": "No node is in rack r12-7.", "matches": ["r12-07"]}]`)',
            ),
        ],
        operation_id="nodes_list",
    )
    def get(self, request):
        # The console's Nodes page filters through the same FilterSet, so both read a query alike.
        filterset = nodes_filtered(request.query_params)
        rows = [row.as_dict() for row in facility_nodes.node_rows(filterset.qs)]
        response = Response(rows)
        if not rows:
            said = filterset.suggestions()  # a term no node has: a typo, likely (what the console says)
            if said:
                response[SUGGESTIONS_HEADER] = json.dumps(said, separators=(",", ":"))
        return response


def node_detail(node: Node) -> dict:
    row = facility_nodes.node_rows(selectors.node_queryset().filter(pk=node.pk))[0]
    body = row.as_dict()
    replicas = placement_selectors.gpu_replicas(node_id=node.pk)
    body.update(
        {
            "labels": selectors.node_label_sources(node.name, node.agent_labels or {}, node.labels),
            "location_conflicts": node.location_conflicts or [],
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
                    "replica": replicas[g.index][0] if g.index in replicas else None,
                    "replica_name": replicas[g.index][1] if g.index in replicas else None,
                }
                for g in node.gpus.all()
            ],
            "gpu_topology": node.gpu_topology or None,
            "sensors": node.sensors,
            "sensors_at": node.sensors_at.isoformat() if node.sensors_at else None,
            "measured_watts": node.measured_watts,
            "measured_peak_watts": node.measured_peak_watts,
            "max_draw_watts": node.max_draw_watts,
            "inventory_pending": services.inventory_pending(node),
            **services.power_source(node.sensors or {}),
            "placed_watts": placement_selectors.placed_watts([node.pk]).get(node.pk, 0.0),
        }
    )
    if body["inventory_pending"] is not None:
        since = body["inventory_pending"]["since"]
        body["inventory_pending"] = {**body["inventory_pending"], "since": since.isoformat() if since else None}
    return body


class NodeDetailView(ApiView):
    @documented(
        summary="One node: location with label sources, hold, GPUs, sensors",
        ok={200: NodeDetailSerializer},
        errors=(404,),
    )
    def get(self, request, name: str):
        node = Node.objects.filter(name=name).first()
        if node is None:
            raise NotFound(f"node {value_shown(name)} is not known", field="name")
        return Response(node_detail(node))


class NodeLabelsView(ApiView):
    @documented(
        summary="Set or remove store labels",
        request=LabelsSerializer,
        ok={200: LabelsResultSerializer},
    )
    def post(self, request, name: str):
        data = LabelsSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        changed = placement_services.labels_change(
            node_name=name, changes=data.validated_data["labels"], set_by=request.user.get_username()
        )
        return Response({"node": name, "labels": changed.value, "warning": "; ".join(changed.warnings) or None})


class NodeCordonView(ApiView):
    @documented(
        summary="Cordon (optionally drain) or uncordon a node",
        request=CordonSerializer,
        ok={200: CordonResultSerializer},
        errors=(404,),
    )
    def post(self, request, name: str):
        data = CordonSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        changed = placement_services.cordon_change(node_name=name, **data.validated_data)
        node = changed.value
        return Response({
            "node": node.name, "cordoned": node.cordoned, "draining": node.draining,
            "warning": "; ".join(changed.warnings) or None,
        })


class NodeInventoryAcceptView(ApiView):
    """POST: take the change of GPUs the node's heartbeats report as its inventory (operator role)."""

    @documented(
        summary="Accept the change of GPUs a node reports: placement and its readings count them from now on",
        ok={200: InventoryAcceptSerializer},
        errors=(404, 409),
    )
    def post(self, request, name: str):
        node = services.node_inventory_accept(node_name=name)
        gpus = list(node.gpus.filter(present=True).order_by("index").values_list("index", flat=True))
        return Response({"node": node.name, "gpus": len(gpus)})


class NodeTokenView(ApiView):
    """POST: a new agent token for the node, returned once (only its hash is kept); admins only."""

    permission_classes = [IsAdmin]

    @documented(
        summary="A new token for a node's agent, shown once; the old one stops working (admins only)",
        ok={200: NodeTokenSerializer},
    )
    def post(self, request, name: str):
        return Response({"node": name, "token": services.node_token_create(node_name=name)})


# -- heartbeats ------------------------------------------------------------------------------------------


class IsNode(BasePermission):
    message = "this endpoint takes a node token (llmgw ctl node token NODE)"

    def has_permission(self, request, view) -> bool:
        return isinstance(request.user, NodeIdentity)


class HeartbeatView(APIView):
    """POST /api/v1/agents/heartbeat: what a node reports; the answer is what it must run."""

    authentication_classes = [NodeTokenAuthentication]
    permission_classes = [IsNode]
    parser_classes = [BoundedJSONParser]
    renderer_classes = [JSONRenderer]

    @documented(
        summary="An agent's heartbeat", request=HeartbeatRequestSchema, ok={200: HeartbeatAnswerSerializer}
    )
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
        # Readings beyond what the node can draw are dropped and named, the rest of the heartbeat kept.
        # What judges its readings: as held for the report it repeats, else read (a change reads it anew).
        digest = services.report_digest(heartbeat)
        facts = readings.node_facts(heartbeat["node"], digest) or services.node_facts(heartbeat["node"], heartbeat)
        heartbeat, warnings = readings.plausible_heartbeat(heartbeat, facts=facts)
        services.heartbeat_record(node_name=heartbeat["node"], heartbeat=heartbeat, digest=digest)
        readings.node_facts_set(heartbeat["node"], facts)
        # From the map of every node's assignments, read at most once a second (and at once after a
        # placement change in this process): the answer the fast lane gives too.
        replicas = readings.assignments(heartbeat["node"])
        return Response(
            readings.answer_for(heartbeat["node"], heartbeat.get("interval_seconds", 10), replicas, warnings),
            status=status.HTTP_200_OK,
        )
