"""Writes to users and their API tokens: the one path `llmgw ctl token create` and POST /api/v1/tokens take."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from rest_framework.authtoken.models import Token

from llmgw.errors import InvalidInput
from llmgw.permissions import ROLES

MAX_USERNAME = 150  # Django's User.username


@transaction.atomic
def token_create(*, username: str, role: str) -> str:
    """The user's API token (made, with the user, if missing), after giving them the role."""
    if role not in ROLES:
        raise InvalidInput(f"role: {role!r} is not a role; roles are {', '.join(ROLES)}", field="role")
    if not isinstance(username, str) or not username or len(username) > MAX_USERNAME:
        raise InvalidInput(f"username: give a name of at most {MAX_USERNAME} characters", field="username")
    try:
        # The admin's own check of a username: a name it could not edit, or one with an escape sequence or a
        # newline for every table that says who held a domain, is not made here either.
        get_user_model().username_validator(username)
    except ValidationError:
        raise InvalidInput(
            f"username: {username!r} is not a username: letters, digits and @ . + - _ only", field="username"
        ) from None
    user, _ = get_user_model().objects.get_or_create(username=username)
    for name in ROLES:
        Group.objects.get_or_create(name=name)
    user.groups.remove(*Group.objects.filter(name__in=ROLES))
    user.groups.add(Group.objects.get(name=role))
    token, _ = Token.objects.get_or_create(user=user)
    return token.key


def is_admin_account(username: str) -> bool:
    """Whether `username` is a staff or superuser account (its token opens the admin's rights)."""
    admins = Q(is_staff=True) | Q(is_superuser=True)
    return get_user_model().objects.filter(admins, username=username).exists()
