"""Writes to users and their API tokens: the one path `llmgw ctl token …`, `llmgw ctl user …`, /api/v1/tokens
and /api/v1/users take. A console user logs in with a password (`llmgw ctl user create NAME --role viewer`). A user has one API token: made (or made again) by an admin, rotated (a new key, the
old one refused at once) or revoked (removed); it expires after its lifetime (LLMGW_TOKEN_LIFETIME)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q

from llmgw.access import models as access
from llmgw.access.models import ApiToken, key_hash
from llmgw.access.tokens import parse_lifetime
from llmgw.errors import Conflict, InvalidInput, NotFound
from llmgw.lock_order import rows_locked
from llmgw.permissions import ROLES, user_roles

MAX_USERNAME = 150  # Django's User.username
# Whoever asks: a token listing shows at most this many (one a user).
MAX_LISTED = 10_000
# A password is hashed whole on every login: one longer than this is refused, not hashed.
MAX_PASSWORD = 1000
# The shortest password, as AUTH_PASSWORD_VALIDATORS' MinimumLengthValidator takes it (llmgw/settings.py): stated in
# the API's schema too, so that a client knows before it sends.
MIN_PASSWORD = 8


def default_lifetime() -> timedelta | None:
    """A new or rotated token's lifetime when none is given: LLMGW_TOKEN_LIFETIME (90d unless set)."""
    return parse_lifetime(settings.LLMGW_TOKEN_LIFETIME)


def lifetime_from(expires: str | None) -> timedelta | None:
    """`expires` as given (`30d`, `never`), or the default when not given; InvalidInput naming it."""
    if expires is None:
        return default_lifetime()
    try:
        return parse_lifetime(expires)
    except ValueError as exc:
        raise InvalidInput(str(exc), field="expires") from None


def check_username(username: str) -> None:
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


def _new_key(user, lifetime: timedelta | None) -> str:
    """A fresh key for `user`, replacing the one they had (that one is refused from now)."""
    key = secrets.token_hex(20)
    made = access.now()
    ApiToken.objects.update_or_create(
        user=user,
        defaults={"key_hash": key_hash(key), "prefix": key[: access.PREFIX_CHARS], "created": made,
                  "last_used": None, "expires": None if lifetime is None else made + lifetime},
    )
    return key


def check_role(role: str) -> None:
    if role not in ROLES:
        raise InvalidInput(f"role: {role!r} is not a role; roles are {', '.join(ROLES)}", field="role")


def _role_give(user, role: str) -> None:
    """The user's one role from now: the groups of the other roles left."""
    for name in ROLES:
        Group.objects.get_or_create(name=name)
    user.groups.remove(*Group.objects.filter(name__in=ROLES))
    user.groups.add(Group.objects.get(name=role))


@transaction.atomic
def token_create(*, username: str, role: str, expires: str | None = None) -> str:
    """A new API token for the user (made, with the user, if missing), after giving them the role. Any token the
    user had stops working: its key is stored only as a hash, so it cannot be shown again."""
    check_role(role)
    check_username(username)
    lifetime = lifetime_from(expires)
    user, _ = get_user_model().objects.get_or_create(username=username)
    _role_give(user, role)
    return _new_key(user, lifetime)


def _token_of(username: str) -> ApiToken:
    check_username(username)
    token = ApiToken.objects.select_related("user").filter(user__username=username).first()
    if token is None:
        raise NotFound(f"username: {username} has no API token (llmgw ctl token create {username})", field="username")
    return token


@transaction.atomic
def token_rotate(*, username: str, expires: str | None = None) -> str:
    """A new key for the user's token, with a fresh lifetime; the old key is refused from now on."""
    lifetime = lifetime_from(expires)
    token = _token_of(username)
    rows_locked(ApiToken.objects.filter(pk=token.pk)).first()
    return _new_key(token.user, lifetime)


def token_revoke(*, username: str) -> None:
    """Remove the user's token: requests with it are refused from now on (the user stays, with their role)."""
    _token_of(username).delete()


@dataclass(frozen=True)
class TokenRow:
    username: str
    role: str
    prefix: str
    created: datetime
    last_used: datetime | None
    expires: datetime | None
    expired: bool


def role_of(user) -> str:
    if user.is_superuser or user.is_staff:
        return "admin"
    roles = user_roles(user)
    return "operator" if "operator" in roles else "viewer" if "viewer" in roles else "none"


def _roles_prefetched(user) -> None:
    """The user's roles from their prefetched groups (llmgw.permissions reads them there), not a query a user."""
    user._llmgw_roles = {g.name for g in user.groups.all() if g.name in ROLES} | (
        set(ROLES) if user.is_staff or user.is_superuser else set()
    )


def token_list(*, username: str | None = None) -> list[TokenRow]:
    """Every user's token (or one user's), by username: who, their role, when made, last used and expiring."""
    tokens = ApiToken.objects.select_related("user").prefetch_related("user__groups").order_by("user__username")
    if username is not None:
        tokens = tokens.filter(user__username=username)
    at = access.now()
    rows = []
    for token in tokens[:MAX_LISTED]:
        user = token.user
        _roles_prefetched(user)
        rows.append(TokenRow(user.username, role_of(user), token.prefix, token.created, token.last_used,
                             token.expires, token.expires is not None and token.expires <= at))
    return rows


def user_unlock(*, username: str) -> int:
    """Lift a login lockout (django-axes) of the user: the failed attempts recorded under their name are
    forgotten. Returns how many records were removed (0: the user was not locked out)."""
    from axes.utils import reset

    check_username(username)
    return reset(username=username)


def check_password(password: str, user=None) -> None:
    """A password the login takes: Django's validators (AUTH_PASSWORD_VALIDATORS: at least 8 characters), and
    at most MAX_PASSWORD characters; InvalidInput naming the field with what is wrong."""
    if not isinstance(password, str) or not password:
        raise InvalidInput("password: give a password", field="password")
    if len(password) > MAX_PASSWORD:
        raise InvalidInput(f"password: at most {MAX_PASSWORD} characters", field="password")
    try:
        validate_password(password, user)
    except ValidationError as exc:
        raise InvalidInput(f"password: {' '.join(exc.messages)}", field="password") from None


@dataclass(frozen=True)
class UserRow:
    username: str
    role: str
    has_password: bool
    has_token: bool
    last_login: datetime | None


def _user_row(user) -> UserRow:
    return UserRow(user.username, role_of(user), user.has_usable_password(), hasattr(user, "api_token"),
                   user.last_login)


def _user(username: str):
    check_username(username)
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise NotFound(f"username: no user {username} (llmgw ctl user list names them)", field="username")
    return user


@transaction.atomic
def user_create(*, username: str, role: str, password: str) -> UserRow:
    """A console user who logs in with `password`, with a role (viewer reads; operator also changes). An admin
    (a staff user, who gives out tokens) is made with `llmgw createsuperuser`."""
    check_username(username)
    check_role(role)
    model = get_user_model()
    if model.objects.filter(username=username).exists():
        raise Conflict(f"username: {username} exists (llmgw ctl user set-password {username} gives a new password)",
                       field="username")
    check_password(password, model(username=username))
    user = model.objects.create_user(username=username, password=password)
    _role_give(user, role)
    return _user_row(user)


@transaction.atomic
def user_password_set(*, username: str, password: str) -> None:
    """A new password for the user; the old one is refused from now (sessions it opened end at their next
    request: Django keys a session to the password's hash)."""
    user = _user(username)
    check_password(password, user)
    user.set_password(password)
    user.save(update_fields=["password"])


@transaction.atomic
def user_remove(*, username: str) -> None:
    """Remove the user and their API token: neither their password nor their token is taken from now on.
    What they did (a hold's 'by') keeps their name."""
    _user(username).delete()


def user_list() -> list[UserRow]:
    """Every user, by username: role, whether they log in with a password, have an API token, last logged in."""
    users = (get_user_model().objects.select_related("api_token").prefetch_related("groups")
             .order_by("username")[:MAX_LISTED])
    rows = []
    for user in users:
        _roles_prefetched(user)
        rows.append(_user_row(user))
    return rows


def is_admin_account(username: str) -> bool:
    """Whether `username` is a staff or superuser account (its token opens the admin's rights)."""
    admins = Q(is_staff=True) | Q(is_superuser=True)
    return get_user_model().objects.filter(admins, username=username).exists()
