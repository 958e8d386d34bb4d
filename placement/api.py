"""REST API of placement: models (list, apply, detail, delete), explain, headroom, replicas."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter
from rest_framework import status
from rest_framework.response import Response

from llmgw.api import STORABLE_TEXT_PATTERN, ApiView, documented
from placement import selectors, services
from placement.serializers import (
    ExplainSerializer,
    HeadroomSerializer,
    ModelAppliedSerializer,
    ModelDetailSerializer,
    ModelDocumentSerializer,
    ModelRowSerializer,
    ReplicaSerializer,
)


class ModelListView(ApiView):
    """GET every model; POST a ``kind: Model`` document as JSON to create or update one (operator)."""

    @documented(summary="Models with replica counts", ok={200: ModelRowSerializer(many=True)}, operation_id="models_list")
    def get(self, request):
        return Response(selectors.model_rows())

    @documented(
        summary="Apply a model document: {kind: Model, name, replicas, profile: {...}}",
        request=ModelDocumentSerializer,
        ok={200: ModelAppliedSerializer, 201: ModelAppliedSerializer},
        errors=(409,),
    )
    def post(self, request):
        applied = services.model_apply(data=request.data)
        code = status.HTTP_201_CREATED if applied.action == "created" else status.HTTP_200_OK
        body = selectors.model_detail(applied.name)
        body["action"] = applied.action
        return Response(body, status=code)


class ModelDetailView(ApiView):
    @documented(
        summary="One model and its replicas", ok={200: ModelDetailSerializer}, errors=(404,),
        operation_id="models_retrieve",
    )
    def get(self, request, name: str):
        return Response(selectors.model_detail(name))

    @documented(summary="Delete a model; its replicas' GPUs are freed", ok={204: None}, errors=(404, 409))
    def delete(self, request, name: str):
        services.model_delete(name=name)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ModelExplainView(ApiView):
    @documented(summary="Why each replica is where it is, or why it waits", ok={200: ExplainSerializer}, errors=(404,))
    def get(self, request, name: str):
        return Response(selectors.model_explain(name))


class ModelHeadroomView(ApiView):
    @documented(
        summary="How many more replicas fit, and why the next does not", ok={200: HeadroomSerializer}, errors=(404,)
    )
    def get(self, request, name: str):
        return Response(selectors.model_headroom(name))


class ReplicaListView(ApiView):
    @documented(
        summary="Replicas with state, shards and the reason a pending one waits",
        ok={200: ReplicaSerializer(many=True)},
        errors=(404,),
        parameters=[OpenApiParameter(
            "model", str, pattern=STORABLE_TEXT_PATTERN, description="Only this model's replicas"
        )],
        operation_id="replicas_list",
    )
    def get(self, request):
        return Response(selectors.replica_rows(model=request.query_params.get("model") or None))
