"""REST API of the facility: domains with power and holds; holds and budgets."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter
from rest_framework import status
from rest_framework.response import Response

from facility import feed_selectors, services
from facility.serializers import (
    DOMAIN_PATTERN,
    BudgetBodySerializer,
    BudgetSerializer,
    FacilitySerializer,
    FeedLossSerializer,
    FeedsSerializer,
    HoldBodySerializer,
    HoldSerializer,
    WhatIfResultSerializer,
    WhatIfSerializer,
)
from llmgw.api import ApiView, documented
from placement import selectors as placement_selectors

DOMAIN_IN_PATH = [OpenApiParameter("domain", str, OpenApiParameter.PATH, pattern=DOMAIN_PATTERN, description="level:name")]


class FacilityView(ApiView):
    @documented(
        summary="Every domain: nodes, use, limit, reserved and measured draw, hold", ok={200: FacilitySerializer}
    )
    def get(self, request):
        return Response(placement_selectors.facility_overview())


def hold_body(hold) -> dict:
    return {
        "domain": hold.domain,
        "reason": hold.reason,
        "drain": hold.drain,
        "created_by": hold.created_by,
        "created_at": hold.created_at.isoformat(),
    }


class HoldListView(ApiView):
    @documented(
        summary="Hold a domain (optionally drain it)", request=HoldSerializer, ok={201: HoldBodySerializer},
        errors=(409,),
    )
    def post(self, request):
        data = HoldSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        hold = services.hold_create(**data.validated_data, created_by=request.user.get_username())
        return Response(hold_body(hold), status=status.HTTP_201_CREATED)


class HoldDetailView(ApiView):
    @documented(
        summary="Release a hold (and stop its drain)", ok={204: None}, errors=(404, 409), parameters=DOMAIN_IN_PATH
    )
    def delete(self, request, domain: str):
        services.hold_release(domain=domain)
        return Response(status=status.HTTP_204_NO_CONTENT)


class BudgetListView(ApiView):
    @documented(
        summary="Set a domain's power budget", request=BudgetSerializer, ok={200: BudgetBodySerializer},
        errors=(409,),
    )
    def post(self, request):
        data = BudgetSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        budget = services.budget_set(**data.validated_data)
        return Response({"domain": budget.domain, "cap_watts": budget.cap_watts, "other_watts": budget.other_watts})


class BudgetDetailView(ApiView):
    @documented(summary="Remove a domain's budget", ok={204: None}, errors=(404, 409), parameters=DOMAIN_IN_PATH)
    def delete(self, request, domain: str):
        services.budget_delete(domain=domain)
        return Response(status=status.HTTP_204_NO_CONTENT)


class FeedListView(ApiView):
    @documented(summary="Power feeds: capacity, the PDUs and racks they supply, their load", ok={200: FeedsSerializer})
    def get(self, request):
        return Response(feed_selectors.feeds_overview())


class FeedLossView(ApiView):
    @documented(
        summary="N−1: what passes its surviving feed's capacity if a feed is lost",
        ok={200: FeedLossSerializer},
        errors=(404,),
        parameters=[OpenApiParameter("feed", str, description="Only the loss of this feed")],
    )
    def get(self, request):
        return Response(feed_selectors.feed_loss_report(feed=request.query_params.get("feed") or None))


class WhatIfView(ApiView):
    @documented(
        summary="Dry run: hold a domain (drain) or lose a feed — moves, blocked replicas, domain use after",
        request=WhatIfSerializer,
        ok={200: WhatIfResultSerializer},
        errors=(404,),
    )
    def post(self, request):
        from placement.whatif import what_if

        data = WhatIfSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        target, drain = data.validated_data["target"], data.validated_data["drain"]
        if ":" in target:
            return Response(what_if(hold=target, drain=drain))
        return Response(what_if(feed=target))
