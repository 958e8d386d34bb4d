"""The console's pages (HTML); the API lives under /api/v1, the live updates under /ws (llmgw.routing)."""

from django.contrib.auth import views as auth_views
from django.urls import path
from django.views.generic import RedirectView

from agents import views as agents_views
from facility import views as facility_views
from placement import views as placement_views

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", RedirectView.as_view(pattern_name="node-list", permanent=False), name="home"),
    path("nodes/", agents_views.node_list, name="node-list"),
    path("nodes/<str:name>/", agents_views.node_detail, name="node-detail"),
    path("nodes/<str:name>/location", agents_views.node_location, name="node-location"),
    path("nodes/<str:name>/hold", agents_views.node_hold, name="node-hold"),
    path("nodes/<str:name>/release", agents_views.node_release, name="node-release"),
    path("nodes/<str:name>/cordon", agents_views.node_cordon, name="node-cordon"),
    path("nodes/<str:name>/history", facility_views.node_history, name="node-history"),
    path("facility/", facility_views.facility_page, name="facility"),
    path("facility/holds", facility_views.hold_create, name="facility-hold"),
    path("facility/holds/release", facility_views.hold_release, name="facility-release"),
    path("facility/holds/preview", facility_views.hold_preview, name="facility-hold-preview"),
    path("facility/shed", facility_views.shed_card, name="facility-shed"),
    path("facility/what-if", facility_views.hold_preview, name="facility-what-if"),
    path("facility/domains/<str:domain>/", facility_views.domain_detail, name="facility-domain"),
    path("facility/domains/<str:domain>/history", facility_views.domain_history, name="facility-domain-history"),
    path("models/", placement_views.model_list, name="model-list"),
    path("models/headroom", placement_views.models_headroom, name="models-headroom"),
    path("models/<str:name>/", placement_views.model_detail, name="model-detail"),
    path("models/<str:name>/headroom", placement_views.model_headroom, name="model-headroom"),
]
