"""Roles: a viewer reads; an operator changes labels, holds, models and budgets; staff use the admin."""

from __future__ import annotations

from rest_framework.permissions import SAFE_METHODS, BasePermission

VIEWER = "viewer"
OPERATOR = "operator"
ROLES = (VIEWER, OPERATOR)


def user_roles(user) -> set[str]:
    if not user or not user.is_authenticated:
        return set()
    cached = getattr(user, "_llmgw_roles", None)
    if cached is None:
        cached = set(user.groups.filter(name__in=ROLES).values_list("name", flat=True))
        if user.is_superuser or user.is_staff:
            cached |= {VIEWER, OPERATOR}
        if OPERATOR in cached:
            cached.add(VIEWER)
        user._llmgw_roles = cached
    return cached


def can_read(user) -> bool:
    return VIEWER in user_roles(user)


def can_operate(user) -> bool:
    return OPERATOR in user_roles(user)


class IsViewer(BasePermission):
    """Reads need a viewer (or operator); writes an operator."""

    message = "your role does not allow this: reading needs the viewer role, changes the operator role"

    def has_permission(self, request, view) -> bool:
        if request.method in SAFE_METHODS:
            return can_read(request.user)
        return can_operate(request.user)
