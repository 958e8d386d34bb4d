from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from agents import api as agents_api
from agents import metrics as agents_metrics
from facility import api as facility_api
from llmgw import users_api
from llmgw.api import api_not_found
from placement import api as placement_api

api_v1 = [
    path("schema", SpectacularAPIView.as_view(), name="schema"),
    # Swagger UI on the schema above, its files vendored (drf-spectacular-sidecar): nothing from a CDN.
    path("docs", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("facility", facility_api.FacilityView.as_view(), name="facility"),
    path("facility/apply", facility_api.FacilityApplyView.as_view(), name="facility-apply"),
    path("facility/import/netbox", facility_api.NetboxImportView.as_view(), name="netbox-import"),
    path("facility/import/status", facility_api.NetboxSyncStatusView.as_view(), name="netbox-import-status"),
    path("facility/import/sync", facility_api.NetboxSyncView.as_view(), name="netbox-import-sync"),
    path("facility/import/jobs", facility_api.ImportJobListView.as_view(), name="netbox-import-jobs"),
    path("facility/import/jobs/<int:job_id>", facility_api.ImportJobView.as_view(), name="netbox-import-job"),
    path("facility/domains/<path:domain>/history", facility_api.DomainHistoryView.as_view(), name="domain-history"),
    path("facility/shed", placement_api.ShedView.as_view(), name="shed"),
    path("facility/capping", placement_api.CappingView.as_view(), name="capping"),
    path("facility/holds", facility_api.HoldListView.as_view(), name="holds"),
    path("facility/holds/<path:domain>", facility_api.HoldDetailView.as_view(), name="hold"),
    path("facility/feeds", facility_api.FeedListView.as_view(), name="feeds"),
    path("facility/feed-loss", facility_api.FeedLossView.as_view(), name="feed-loss"),
    path("facility/what-if", facility_api.WhatIfView.as_view(), name="what-if"),
    path("facility/budgets", facility_api.BudgetListView.as_view(), name="budgets"),
    path("facility/events", facility_api.ConditionEventListView.as_view(), name="condition-events"),
    path("facility/conditions", facility_api.ConditionOverrideListView.as_view(), name="condition-overrides"),
    path(
        "facility/conditions/<path:domain>", facility_api.ConditionOverrideDetailView.as_view(),
        name="condition-override",
    ),
    path("facility/budgets/<path:domain>", facility_api.BudgetDetailView.as_view(), name="budget"),
    path("nodes", agents_api.NodeListView.as_view(), name="nodes"),
    path("nodes/<str:name>", agents_api.NodeDetailView.as_view(), name="node"),
    path("nodes/<str:name>/labels", agents_api.NodeLabelsView.as_view(), name="node-labels"),
    path("nodes/<str:name>/cordon", agents_api.NodeCordonView.as_view(), name="node-cordon"),
    path("nodes/<str:name>/token", agents_api.NodeTokenView.as_view(), name="node-token"),
    path(
        "nodes/<str:name>/inventory/accept", agents_api.NodeInventoryAcceptView.as_view(), name="node-inventory-accept"
    ),
    path("tokens", users_api.TokenListView.as_view(), name="tokens"),
    path("tokens/<str:username>", users_api.TokenDetailView.as_view(), name="token"),
    path("tokens/<str:username>/rotate", users_api.TokenRotateView.as_view(), name="token-rotate"),
    path("users", users_api.UserListView.as_view(), name="users"),
    path("users/<str:username>", users_api.UserDetailView.as_view(), name="user"),
    path("users/<str:username>/password", users_api.UserPasswordView.as_view(), name="user-password"),
    path("users/<str:username>/unlock", users_api.UserUnlockView.as_view(), name="user-unlock"),
    path("agents/heartbeat", agents_api.HeartbeatView.as_view(), name="heartbeat"),
    path("apply", placement_api.ModelsApplyView.as_view(), name="apply"),
    path("models", placement_api.ModelListView.as_view(), name="models"),
    path("models/<str:name>", placement_api.ModelDetailView.as_view(), name="model"),
    path("models/<str:name>/explain", placement_api.ModelExplainView.as_view(), name="model-explain"),
    path("models/<str:name>/headroom", placement_api.ModelHeadroomView.as_view(), name="model-headroom"),
    path("replicas", placement_api.ReplicaListView.as_view(), name="replicas"),
    path("placement/rules", placement_api.RulesView.as_view(), name="placement-rules"),
    re_path(r"^[\s\S]*\Z", api_not_found),  # last: a JSON 404 for every other path under /api/v1/
]

urlpatterns = [
    path("api/v1/", include(api_v1)),
    path("admin/", admin.site.urls),
    path("metrics", agents_metrics.metrics_view, name="prometheus-django-metrics"),
    path("", include("llmgw.console_urls")),
]
