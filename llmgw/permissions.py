"""Roles: a viewer reads; an operator changes labels, holds, models and budgets; staff use the admin.

Credentials (API tokens, which make users and give roles, and node tokens, which speak for a node) are
the admins': staff, as in the Django admin where users and roles are kept.
"""

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


def can_administer(user) -> bool:
    """Staff (or a superuser): the people of the Django admin, who keep users, roles and credentials."""
    return bool(user and user.is_authenticated and (user.is_staff or user.is_superuser))


class IsAdmin(BasePermission):
    """Making credentials: an API token for a user, a node's agent token."""

    message = "your role does not allow this: tokens are made by an admin (a staff user)"

    def has_permission(self, request, view) -> bool:
        return can_administer(request.user)
