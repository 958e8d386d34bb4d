"""The console's pages (HTML); the API lives under /api/v1."""

from django.contrib.auth import views as auth_views
from django.urls import path
from django.views.generic import RedirectView

from agents import views as agents_views

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", RedirectView.as_view(pattern_name="node-list", permanent=False), name="home"),
    path("nodes/", agents_views.node_list, name="node-list"),
]
