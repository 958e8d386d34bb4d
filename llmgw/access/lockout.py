"""What a locked-out login sees (django-axes' AXES_LOCKOUT_CALLABLE): the login page again, saying why and
for how long, with 429, for the console's login and the admin's alike."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.shortcuts import render


def lockout_message() -> str:
    minutes = settings.AXES_COOLOFF_TIME.total_seconds() / 60
    return (
        f"Too many failed logins ({settings.AXES_FAILURE_LIMIT}) for this username or from this address: "
        f"logins are refused for {minutes:g} minutes. An admin can lift it sooner: llmgw ctl user unlock USERNAME."
    )


def lockout_response(request, original_response=None, credentials=None):
    username = (credentials or {}).get("username") or request.POST.get("username", "")
    form = AuthenticationForm(request, initial={"username": username[:150]})
    context = {"form": form, "lockout": lockout_message(), "next": request.POST.get("next", "")[:2000]}
    return render(request, "registration/login.html", context, status=429)
