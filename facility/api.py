"""REST API of the facility: domains with power and holds; holds and budgets."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from facility import services
from placement import selectors as placement_selectors


class FacilityView(APIView):
    @extend_schema(responses={200: dict}, summary="Every domain: nodes, use, limit, reserved and measured draw, hold")
    def get(self, request):
        return Response(placement_selectors.facility_overview())


class StrictSerializer(serializers.Serializer):
    """Refuses fields it does not know, naming them: a misspelt `drian` must not be silently dropped."""

    def validate(self, attrs):
        unknown = sorted(set(self.initial_data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError(
                {unknown[0]: [f"unknown field; this takes {', '.join(self.fields)}"]}
            )
        return attrs


class HoldSerializer(StrictSerializer):
    domain = serializers.CharField(max_length=300, help_text="level:name, e.g. rack:r12-07")
    reason = serializers.CharField(max_length=500)
    drain = serializers.BooleanField(required=False, allow_null=True, default=None,
                                     help_text="not given: as it was (false for a new hold)")


def hold_body(hold) -> dict:
    return {
        "domain": hold.domain,
        "reason": hold.reason,
        "drain": hold.drain,
        "created_by": hold.created_by,
        "created_at": hold.created_at.isoformat(),
    }


class HoldListView(APIView):
    @extend_schema(request=HoldSerializer, responses={201: dict}, summary="Hold a domain (optionally drain it)")
    def post(self, request):
        data = HoldSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        hold = services.hold_create(**data.validated_data, created_by=request.user.get_username())
        return Response(hold_body(hold), status=status.HTTP_201_CREATED)


class HoldDetailView(APIView):
    @extend_schema(responses={204: None}, summary="Release a hold (and stop its drain)")
    def delete(self, request, domain: str):
        services.hold_release(domain=domain)
        return Response(status=status.HTTP_204_NO_CONTENT)


class BudgetSerializer(StrictSerializer):
    domain = serializers.CharField(max_length=300)
    cap_watts = serializers.FloatField()
    other_watts = serializers.FloatField(required=False, allow_null=True, default=None,
                                         help_text="not given: as it was (0 for a new budget)")


class BudgetListView(APIView):
    @extend_schema(request=BudgetSerializer, responses={200: dict}, summary="Set a domain's power budget")
    def post(self, request):
        data = BudgetSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        budget = services.budget_set(**data.validated_data)
        return Response({"domain": budget.domain, "cap_watts": budget.cap_watts, "other_watts": budget.other_watts})


class BudgetDetailView(APIView):
    @extend_schema(responses={204: None}, summary="Remove a domain's budget")
    def delete(self, request, domain: str):
        services.budget_delete(domain=domain)
        return Response(status=status.HTTP_204_NO_CONTENT)
