"""REST API of placement: models (list, apply, detail, delete), explain, headroom, replicas; shedding and capping."""

from __future__ import annotations

import re

from drf_spectacular.utils import OpenApiParameter
from rest_framework import status
from rest_framework.response import Response

from llmgw.api import STORABLE_TEXT_PATTERN, ApiView, documented
from llmgw.errors import InvalidInput
from placement import selectors, services
from placement.capping import capping_listing
from placement.documents import MAX_REPLICAS_TOTAL
from placement.serializers import (
    CappingListingSerializer,
    ExplainSerializer,
    HeadroomSerializer,
    ModelAppliedSerializer,
    ModelDeletedSerializer,
    ModelDetailSerializer,
    ModelDocumentSerializer,
    ModelRowSerializer,
    ModelsAppliedSerializer,
    ModelsApplySerializer,
    ReplicaSerializer,
    RulesSerializer,
    ShedListingSerializer,
)
from placement.shedding import shed_listing

# ?intervals= of the shed listing (llmgw ctl facility shed keeps its --intervals within these too).
MAX_SHED_INTERVALS = 100


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
        body["warning"] = applied.warning
        return Response(body, status=code)


class ModelsApplyView(ApiView):
    """POST a models.yaml whole: every model of it in one transaction, or none with the reason."""

    text_field = "text"

    @documented(
        summary="Apply a models.yaml (kind: Model documents), all or nothing (llmgw ctl apply -f)",
        request=ModelsApplySerializer, ok={200: ModelsAppliedSerializer}, errors=(409,),
    )
    def post(self, request):
        data = ModelsApplySerializer(data=request.data)
        data.is_valid(raise_exception=True)
        applied = services.models_apply(**data.validated_data)
        return Response(
            {"models": [{**selectors.model_detail(a.name), "action": a.action, "warning": a.warning} for a in applied]}
        )


class ModelDetailView(ApiView):
    @documented(
        summary="One model and its replicas", ok={200: ModelDetailSerializer}, errors=(404,),
        operation_id="models_retrieve",
    )
    def get(self, request, name: str):
        return Response(selectors.model_detail(name))

    @documented(
        summary="Delete a model; its replicas are stopped and their GPUs freed", ok={200: ModelDeletedSerializer},
        errors=(404, 409),
    )
    def delete(self, request, name: str):
        removed = services.model_delete(name=name)
        return Response({"name": name, "replicas_removed": removed})


def _whole_number(request, name: str, default: int, minimum: int, maximum: int) -> int:
    """A query parameter that is a whole number within bounds, else 400 naming it."""
    text = request.query_params.get(name, str(default))
    if not (text.isascii() and text.isdigit()) or not minimum <= int(text) <= maximum:
        raise InvalidInput(f"{name}: a whole number from {minimum} to {maximum:,}", field=name)
    return int(text)


# ?offset= past every replica there can be (documents.MAX_REPLICAS_TOTAL) is refused, not counted through.
MAX_REPLICAS_OFFSET = MAX_REPLICAS_TOTAL


def _page_parameters(limit_text: str) -> list[OpenApiParameter]:
    """A paged listing of replicas' ``limit`` (described by ``limit_text``) and ``offset``, for its schema."""
    return [
        OpenApiParameter(
            "limit", {"type": "integer", "minimum": 1, "maximum": selectors.REPLICAS_PAGE_MAX},
            OpenApiParameter.QUERY, required=False, description=limit_text,
        ),
        OpenApiParameter(
            "offset", {"type": "integer", "minimum": 0, "maximum": MAX_REPLICAS_OFFSET},
            OpenApiParameter.QUERY, required=False, description="skip this many first (default 0)",
        ),
    ]


def _page_of(request, default: int) -> tuple[int, int]:
    """The (offset, limit) a paged listing of replicas was asked, each within its bounds (else 400 naming it)."""
    limit = _whole_number(request, "limit", default, 1, selectors.REPLICAS_PAGE_MAX)
    return _whole_number(request, "offset", 0, 0, MAX_REPLICAS_OFFSET), limit


class ModelExplainView(ApiView):
    @documented(
        summary="Why each replica is where it is, or why it waits: a page of replicas by ordinal, counts of all",
        ok={200: ExplainSerializer},
        errors=(404,),
        parameters=_page_parameters(f"explain at most this many replicas (default {selectors.EXPLAIN_PAGE})"),
    )
    def get(self, request, name: str):
        offset, limit = _page_of(request, selectors.EXPLAIN_PAGE)
        return Response(selectors.model_explain(name, offset=offset, limit=limit))


class ModelHeadroomView(ApiView):
    @documented(
        summary="How many more replicas fit, and why the next does not", ok={200: HeadroomSerializer}, errors=(404,)
    )
    def get(self, request, name: str):
        return Response(selectors.model_headroom(name))


class RulesView(ApiView):
    @documented(
        summary="The placement rules: every filter and scorer, built in and loaded, and whether the index keeps "
        "its plans with them",
        ok={200: RulesSerializer},
    )
    def get(self, request):
        from placement.explain import rules_listing

        return Response(rules_listing())


class ReplicaListView(ApiView):
    @documented(
        summary="Replicas with state, shards and the reason a pending one waits: a page, by model and ordinal",
        ok={200: ReplicaSerializer(many=True)},
        errors=(404,),
        parameters=[
            OpenApiParameter("model", str, pattern=STORABLE_TEXT_PATTERN, description="Only this model's replicas"),
            *_page_parameters(
                f"at most this many (default {selectors.REPLICAS_PAGE}); a page shorter is the last"
            ),
        ],
        operation_id="replicas_list",
    )
    def get(self, request):
        offset, limit = _page_of(request, selectors.REPLICAS_PAGE)
        model = request.query_params.get("model") or None
        return Response(selectors.replica_rows(model=model, offset=offset, limit=limit))


class ShedView(ApiView):
    """GET the moves shedding would make: a dry run, nothing is written (viewer)."""

    @documented(
        summary="The moves shedding would make off hot or over-limit domains in the next intervals (a dry run)",
        ok={200: ShedListingSerializer},
        parameters=[OpenApiParameter(
            "intervals", {"type": "integer", "minimum": 1, "maximum": MAX_SHED_INTERVALS}, OpenApiParameter.QUERY,
            required=False, description="how many intervals ahead (default 3)",
        )],
    )
    def get(self, request):
        text = request.query_params.get("intervals", "3")
        if not re.fullmatch(r"[0-9]{1,3}", text) or not 1 <= int(text) <= MAX_SHED_INTERVALS:
            raise InvalidInput(f"intervals: a whole number from 1 to {MAX_SHED_INTERVALS}", field="intervals")
        return Response(shed_listing(intervals=int(text)))


class CappingView(ApiView):
    """GET what capping asks of each node's GPUs, or would ask in observe mode (viewer)."""

    @documented(
        summary="GPU caps: the nodes capped (or, in observe mode, that would be) and why", ok={200: CappingListingSerializer}
    )
    def get(self, request):
        return Response(capping_listing())
