"""REST API of the facility: domains with power and holds; holds, budgets, conditions; apply, NetBox import."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter
from rest_framework import status
from rest_framework.response import Response

from facility import feed_selectors, import_jobs, netbox_import, selectors, services
from facility.models import ImportJob
from facility.serializers import (
    DOMAIN_OR_EMPTY_PATTERN,
    DOMAIN_PATTERN,
    BudgetBodySerializer,
    BudgetRemovedSerializer,
    BudgetSerializer,
    ConditionEventSerializer,
    ConditionOverrideBodySerializer,
    ConditionOverrideSerializer,
    DomainHistorySerializer,
    FacilityAppliedSerializer,
    FacilityApplySerializer,
    FacilitySerializer,
    FeedLossSerializer,
    FeedsSerializer,
    HistoryQuerySerializer,
    HoldBodySerializer,
    HoldSerializer,
    ImportJobSerializer,
    NetboxImportedSerializer,
    NetboxImportSerializer,
    NetboxSyncBodySerializer,
    NetboxSyncStatusSerializer,
    WhatIfResultSerializer,
    WhatIfSerializer,
)
from llmgw.api import STORABLE_TEXT_PATTERN, ApiView, documented
from llmgw.errors import Conflict, InvalidInput
from placement import selectors as placement_selectors
from placement import services as placement_services

DOMAIN_IN_PATH = [OpenApiParameter("domain", str, OpenApiParameter.PATH, pattern=DOMAIN_PATTERN, description="level:name")]


class FacilityView(ApiView):
    @documented(
        summary="Every domain: nodes, use, limit, reserved and measured draw, hold", ok={200: FacilitySerializer}
    )
    def get(self, request):
        return Response(placement_selectors.facility_overview())


class FacilityApplyView(ApiView):
    """POST a server.yaml whole (and the files it names): applied all or nothing, as on the database."""

    text_field = "text"

    @documented(
        summary="Apply a server.yaml's facility: block, all or nothing (llmgw ctl facility apply -f)",
        request=FacilityApplySerializer, ok={200: FacilityAppliedSerializer}, errors=(403, 409),
    )
    def post(self, request):
        data = FacilityApplySerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        # files always given (if empty): what the file names is read from the request, never from this disk.
        return Response(
            services.facility_apply(
                text=values["text"], filename=values["filename"], files=values["files"],
                # The server fetches from the Prometheus a file names: only an admin may name a new one.
                may_change_sources=request.user.is_staff,
                # A file that removes what an earlier one set says so first (ctl: --yes).
                confirm=values["confirm"],
            )
        )


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
        # The one hold flow (the console's and ctl's): the hold with its preview's warnings.
        created = placement_services.hold_create(**data.validated_data, created_by=request.user.get_username())
        warning = "; ".join(created.warnings) or None
        return Response({**hold_body(created.hold), "warning": warning}, status=status.HTTP_201_CREATED)


class HoldDetailView(ApiView):
    @documented(
        summary="Release a hold (and stop its drain)", ok={204: None}, errors=(404, 409), parameters=DOMAIN_IN_PATH
    )
    def delete(self, request, domain: str):
        placement_services.hold_release(domain=domain)
        return Response(status=status.HTTP_204_NO_CONTENT)


class BudgetListView(ApiView):
    @documented(
        summary="Set a domain's power budget", request=BudgetSerializer, ok={200: BudgetBodySerializer},
        errors=(409,),
    )
    def post(self, request):
        data = BudgetSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        changed = placement_services.budget_change(**data.validated_data)
        budget = changed.value
        return Response({
            "domain": budget.domain, "cap_watts": budget.cap_watts, "other_watts": budget.other_watts,
            "warning": "; ".join(changed.warnings) or None,
        })


class BudgetDetailView(ApiView):
    @documented(
        summary="Remove a domain's budget", ok={200: BudgetRemovedSerializer}, errors=(404, 409),
        parameters=DOMAIN_IN_PATH,
    )
    def delete(self, request, domain: str):
        changed = placement_services.budget_remove(domain=domain)
        return Response({"domain": services.clean_domain(domain), "warning": "; ".join(changed.warnings) or None})


class DomainHistoryView(ApiView):
    @documented(
        summary="A domain's history: use, reserved, measured peak, inlet air (1-minute points to 48 h, 15-minute to 30 days)",
        ok={200: DomainHistorySerializer},
        errors=(404,),  # a path no route takes (a '/' in the domain)
        parameters=[*DOMAIN_IN_PATH, HistoryQuerySerializer],
    )
    def get(self, request, domain: str):
        from facility.history import domain_history

        query = HistoryQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        return Response(domain_history(domain=services.clean_domain(domain), hours=query.validated_data["hours"]))
EVENT_PARAMETERS = [
    OpenApiParameter("domain", str, OpenApiParameter.QUERY, required=False, pattern=DOMAIN_OR_EMPTY_PATTERN,
                     description="only this domain (empty: every domain)"),
    OpenApiParameter(
        "limit", {"type": "integer", "minimum": 1, "maximum": selectors.MAX_EVENTS}, OpenApiParameter.QUERY,
        required=False, description="at most this many (default 200)",
    ),
]


class ConditionEventListView(ApiView):
    @documented(
        summary="The timeline of condition changes, newest first (kept 30 days)",
        ok={200: ConditionEventSerializer(many=True)}, parameters=EVENT_PARAMETERS,
    )
    def get(self, request):
        domain = request.query_params.get("domain") or None
        if domain is not None:
            domain = services.clean_domain(domain)
        limit_text = request.query_params.get("limit", "200")
        if not (limit_text.isascii() and limit_text.isdigit()) or not 1 <= int(limit_text) <= selectors.MAX_EVENTS:
            raise InvalidInput(f"limit: a whole number from 1 to {selectors.MAX_EVENTS}", field="limit")
        return Response(selectors.condition_events(domain=domain, limit=int(limit_text)))


def override_body(override) -> dict:
    return {
        "domain": override.domain,
        "condition": override.condition,
        "reason": override.reason,
        "until": override.until.isoformat() if override.until else None,
        "created_by": override.created_by,
    }


class ConditionOverrideListView(ApiView):
    @documented(
        summary="Set a domain's condition by hand (a known sensor fault)",
        request=ConditionOverrideSerializer, ok={201: ConditionOverrideBodySerializer}, errors=(409,),
    )
    def post(self, request):
        data = ConditionOverrideSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        seconds = values.pop("for_seconds")
        override = services.condition_override_set(
            **values, seconds=seconds, created_by=request.user.get_username()
        )
        return Response(override_body(override), status=status.HTTP_201_CREATED)


class ConditionOverrideDetailView(ApiView):
    @documented(
        summary="Clear a condition set by hand", ok={204: None}, errors=(404, 409), parameters=DOMAIN_IN_PATH
    )
    def delete(self, request, domain: str):
        services.condition_override_clear(domain=domain)
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
        parameters=[OpenApiParameter(
            "feed", str, pattern=STORABLE_TEXT_PATTERN, description="Only the loss of this feed"
        )],
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


class NetboxImportView(ApiView):
    """POST NetBox's CSV of power feeds (applied in the request: nothing outside is waited for), or name a
    NetBox the server may read (a job: 202 and its id); dry_run writes nothing."""

    @documented(
        summary="Import feeds and node locations from NetBox, all or nothing; dry_run: the diff alone. With csv, "
        "the diff applied (200); with url, a job that reads NetBox off the request (202: GET its id for progress "
        "and the diff)",
        request=NetboxImportSerializer, ok={200: NetboxImportedSerializer, 202: ImportJobSerializer}, errors=(409,),
    )
    def post(self, request):
        data = NetboxImportSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        if "csv" in values:
            plan = netbox_import.plan_from_export(values["csv"], default_utilization=values["default_utilization"])
            return Response(netbox_import.netbox_import(plan=plan, dry_run=values["dry_run"], confirm=values["confirm"]))
        url = values["url"].rstrip("/")
        # The server reaches out only to a NetBox its admins named: a client's body picks no address.
        if url not in settings.LLMGW_NETBOX_URLS:
            named = ", ".join(settings.LLMGW_NETBOX_URLS) or "none is set"
            raise InvalidInput(
                f"url: this server reads only the NetBox its LLMGW_NETBOX_URLS names ({named}); "
                "send the CSV export instead, or import where the database is", field="url",
            )
        netbox_import.device_map_parse(values["map"])  # refused now, naming the entry, not when the job runs
        job = import_jobs.import_job_create(
            url=url, token=values["token"], site=values["site"], dry_run=values["dry_run"], confirm=values["confirm"],
            options={"roles": values["roles"], "row_from": values["row_from"], "map": values["map"]},
            requested_by=request.user.get_username(),
        )
        return job_accepted(job)


def job_accepted(job) -> Response:
    """202 with the job as it stands, and where to read it."""
    job.refresh_from_db()  # run already, where no worker runs it (a command, a test)
    return Response(ImportJobSerializer(job).data, status=status.HTTP_202_ACCEPTED,
                    headers={"Location": f"/api/v1/facility/import/jobs/{job.pk}"})


class ImportJobView(ApiView):
    @documented(
        summary="A NetBox import or sync job: its phase, the objects read and applied, and once done its diff "
        "(or why it failed)",
        ok={200: ImportJobSerializer}, errors=(404,),
    )
    def get(self, request, job_id: int):
        return Response(ImportJobSerializer(import_jobs.import_job_get(job_id)).data)


class ImportJobListView(ApiView):
    @documented(summary="The newest NetBox import and sync jobs (50), newest first", ok={200: ImportJobSerializer(many=True)})
    def get(self, request):
        return Response(ImportJobSerializer(import_jobs.jobs_recent(), many=True).data)


class NetboxSyncStatusView(ApiView):
    @documented(
        summary="The NetBox import of each site as it last ran: when, what it applied, what waits for a yes",
        ok={200: NetboxSyncStatusSerializer(many=True)},
    )
    def get(self, request):
        from facility.netbox_sync import sync_status

        return Response(NetboxSyncStatusSerializer(sync_status(), many=True).data)


class NetboxSyncView(ApiView):
    @documented(
        summary="Run the configured NetBox sync now (server.yaml facility.netbox) as a job (202: GET its id); "
        "confirm: what waits for a yes too",
        request=NetboxSyncBodySerializer, ok={202: ImportJobSerializer}, errors=(409,),
    )
    def post(self, request):
        from facility.netbox_sync import configured

        data = NetboxSyncBodySerializer(data=request.data)
        data.is_valid(raise_exception=True)
        if configured() is None:
            raise Conflict("facility.netbox: no NetBox is configured (server.yaml facility.netbox)", field="netbox")
        job = import_jobs.import_job_create(
            kind=ImportJob.Kind.SYNC, confirm=data.validated_data["confirm"], dry_run=data.validated_data["dry_run"],
            requested_by=request.user.get_username(),
        )
        return job_accepted(job)
