"""REST API of placement: models (list, apply, detail, delete), explain, headroom, replicas."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from placement import selectors, services


class ModelListView(APIView):
    """GET every model; POST a ``kind: Model`` document as JSON to create or update one (operator)."""

    @extend_schema(responses={200: dict}, operation_id="models_list", summary="Models with replica counts")
    def get(self, request):
        return Response(selectors.model_rows())

    @extend_schema(
        request=dict,
        responses={200: dict, 201: dict},
        summary="Apply a model document: {kind: Model, name, replicas, profile: {...}}",
    )
    def post(self, request):
        applied = services.model_apply(data=request.data)
        code = status.HTTP_201_CREATED if applied.action == "created" else status.HTTP_200_OK
        body = selectors.model_detail(applied.name)
        body["action"] = applied.action
        return Response(body, status=code)


class ModelDetailView(APIView):
    @extend_schema(
        responses={200: dict}, operation_id="models_retrieve", summary="One model and its replicas"
    )
    def get(self, request, name: str):
        return Response(selectors.model_detail(name))

    @extend_schema(responses={204: None}, summary="Delete a model; its replicas' GPUs are freed")
    def delete(self, request, name: str):
        services.model_delete(name=name)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ModelExplainView(APIView):
    @extend_schema(responses={200: dict}, summary="Why each replica is where it is, or why it waits")
    def get(self, request, name: str):
        return Response(selectors.model_explain(name))


class ModelHeadroomView(APIView):
    @extend_schema(responses={200: dict}, summary="How many more replicas fit, and why the next does not")
    def get(self, request, name: str):
        return Response(selectors.model_headroom(name))


class ReplicaListView(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("model", str, description="Only this model's replicas")],
        responses={200: dict},
        operation_id="replicas_list",
        summary="Replicas with state, shards and the reason a pending one waits",
    )
    def get(self, request):
        return Response(selectors.replica_rows(model=request.query_params.get("model") or None))
