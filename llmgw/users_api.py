"""REST API of API tokens, users and logins: /api/v1/tokens (list, create), /api/v1/tokens/<username> (revoke),
/api/v1/tokens/<username>/rotate, /api/v1/users (list, create), /api/v1/users/<username> (remove),
/api/v1/users/<username>/password, /api/v1/users/<username>/unlock — what `llmgw ctl token …` and
`llmgw ctl user …` call in remote mode. A user lists, rotates and revokes their own token and sets their own
password; an admin (staff) anyone's, and only a superuser an admin's."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema_field
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from facility.serializers import StrictSerializer
from llmgw.access.tokens import LIFETIME_PATTERN
from llmgw.api import ApiView, TextField, documented
from llmgw.permissions import ROLES, IsAdmin, can_administer
from llmgw.users import (
    MAX_PASSWORD,
    MAX_USERNAME,
    MIN_PASSWORD,
    is_admin_account,
    token_create,
    token_list,
    token_revoke,
    token_rotate,
    user_create,
    user_list,
    user_password_set,
    user_remove,
    user_unlock,
)


@extend_schema_field({"type": "string", "pattern": r"^[\w.@+-]+$", "maxLength": MAX_USERNAME})
class UsernameField(TextField):
    """A username as the admin takes one (Django's validator): the schema states its form, the service checks it."""


EXPIRES_HELP = "the token's lifetime: e.g. 90d, 12h, 30m, or never; LLMGW_TOKEN_LIFETIME (90d) when not given"


@extend_schema_field({"type": "string", "pattern": LIFETIME_PATTERN, "maxLength": 6})
class LifetimeField(TextField):
    """A token's lifetime (`90d`, `never`): the schema states its form, the service checks it."""


class TokenCreateSerializer(StrictSerializer):
    username = UsernameField(max_length=MAX_USERNAME, help_text="made if missing; letters, digits and @ . + - _")
    role = serializers.ChoiceField(choices=ROLES, help_text="the user's one role from now (viewer or operator)")
    expires = LifetimeField(max_length=6, required=False, help_text=EXPIRES_HELP)


class TokenRotateSerializer(StrictSerializer):
    expires = LifetimeField(max_length=6, required=False, help_text=EXPIRES_HELP)


class TokenSerializer(serializers.Serializer):
    username = serializers.CharField()
    role = serializers.CharField(help_text="viewer, operator or admin")
    token = serializers.CharField(help_text="send as 'Authorization: Token <key>'; shown this once only")
    expires = serializers.DateTimeField(allow_null=True, help_text="null: never")


class TokenRowSerializer(serializers.Serializer):
    username = serializers.CharField()
    role = serializers.CharField(help_text="viewer, operator, admin, or none")
    prefix = serializers.CharField(help_text="the key's first characters, to tell tokens apart")
    created = serializers.DateTimeField()
    last_used = serializers.DateTimeField(allow_null=True, help_text="to the minute; null: never used")
    expires = serializers.DateTimeField(allow_null=True, help_text="null: never")
    expired = serializers.BooleanField()


# In the words Django's validator uses, as ctl says it.
TOO_SHORT = {"min_length": f"This password is too short. It must contain at least {MIN_PASSWORD} characters."}


class UserCreateSerializer(StrictSerializer):
    username = UsernameField(max_length=MAX_USERNAME, help_text="a new user; letters, digits and @ . + - _")
    role = serializers.ChoiceField(choices=ROLES, help_text="viewer reads; operator also changes")
    password = TextField(min_length=MIN_PASSWORD, max_length=MAX_PASSWORD, error_messages=TOO_SHORT,
                         help_text="what they log in to the console with; at least 8 characters")


class PasswordSerializer(StrictSerializer):
    password = TextField(min_length=MIN_PASSWORD, max_length=MAX_PASSWORD, error_messages=TOO_SHORT,
                         help_text="the new password; at least 8 characters")


class UserRowSerializer(serializers.Serializer):
    username = serializers.CharField()
    role = serializers.CharField(help_text="viewer, operator, admin, or none")
    has_password = serializers.BooleanField(help_text="false: the user cannot log in to the console")
    has_token = serializers.BooleanField()
    last_login = serializers.DateTimeField(allow_null=True, help_text="null: never logged in")


class UnlockSerializer(serializers.Serializer):
    username = serializers.CharField()
    removed = serializers.IntegerField(help_text="records of failed logins removed (one a username and address; 0: none)")


USERNAME_IN_PATH = [OpenApiParameter("username", str, OpenApiParameter.PATH, description="the token's user")]


def check_may_change(request, username: str, what: str = "token") -> None:
    """A user changes their own token (or password); an admin anyone's; an admin's only a superuser (or its owner)."""
    user = request.user
    if user.get_username() == username:
        return
    if not can_administer(user):
        raise PermissionDenied(f"username: {username} is not you; only an admin (a staff user) changes another's {what}")
    if is_admin_account(username) and not user.is_superuser:
        raise PermissionDenied(f"username: {username} is an admin; only a superuser changes an admin's {what}")


def issued(username: str, key: str) -> dict:
    row = token_list(username=username)[0]
    return {"username": username, "role": row.role, "token": key, "expires": row.expires}


class TokenListView(ApiView):
    """GET: the tokens you may see (an admin: everyone's; others: their own). POST: a user's API token with a
    role, the user made if missing; admins only."""

    permission_classes = [IsAuthenticated]

    @documented(summary="API tokens: everyone's for an admin, your own otherwise",
                ok={200: TokenRowSerializer(many=True)})
    def get(self, request):
        username = None if can_administer(request.user) else request.user.get_username()
        return Response(TokenRowSerializer(token_list(username=username), many=True).data)

    @documented(
        summary="A new API token for a user (made if missing) with a role; admins (staff) only",
        request=TokenCreateSerializer, ok={200: TokenSerializer}, errors=(409,),
    )
    def post(self, request):
        if not IsAdmin().has_permission(request, self):
            raise PermissionDenied(IsAdmin.message)
        data = TokenCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        username, role = data.validated_data["username"], data.validated_data["role"]
        # A staff user's token is the admin's rights: only a superuser hands one out here.
        if is_admin_account(username) and not request.user.is_superuser:
            raise PermissionDenied(f"username: {username} is an admin; only a superuser gives out an admin's token")
        key = token_create(username=username, role=role, expires=data.validated_data.get("expires"))
        return Response(issued(username, key))


class TokenDetailView(ApiView):
    """DELETE: revoke a user's token (refused from now on)."""

    permission_classes = [IsAuthenticated]

    @documented(summary="Revoke a user's API token: yours, or (an admin) anyone's", ok={204: None}, errors=(404,),
                parameters=USERNAME_IN_PATH)
    def delete(self, request, username: str):
        check_may_change(request, username)
        token_revoke(username=username)
        return Response(status=status.HTTP_204_NO_CONTENT)


class TokenRotateView(ApiView):
    """POST: a new key for a user's token; the old key is refused from now on."""

    permission_classes = [IsAuthenticated]

    @documented(summary="Rotate a user's API token (a new key; the old one refused at once)",
                request=TokenRotateSerializer, ok={200: TokenSerializer}, errors=(404,), parameters=USERNAME_IN_PATH)
    def post(self, request, username: str):
        check_may_change(request, username)
        data = TokenRotateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        key = token_rotate(username=username, expires=data.validated_data.get("expires"))
        return Response(issued(username, key))


class UserUnlockView(ApiView):
    """POST: lift a user's login lockout; admins only."""

    permission_classes = [IsAdmin]

    @documented(summary="Lift a user's login lockout (failed logins forgotten); admins (staff) only",
                ok={200: UnlockSerializer}, parameters=USERNAME_IN_PATH)
    def post(self, request, username: str):
        return Response({"username": username, "removed": user_unlock(username=username)})


class IsUserAdmin(IsAdmin):
    message = "your role does not allow this: users are made, listed and removed by an admin (a staff user)"


class UserListView(ApiView):
    """GET: every user, with role and whether they have a password and a token. POST: a console user with a
    password and a role. Admins only."""

    permission_classes = [IsUserAdmin]

    @documented(summary="Users: role, password or not, API token or not, last login; admins (staff) only",
                ok={200: UserRowSerializer(many=True)})
    def get(self, request):
        return Response(UserRowSerializer(user_list(), many=True).data)

    @documented(summary="A console user with a password and a role; admins (staff) only",
                request=UserCreateSerializer, ok={201: UserRowSerializer}, errors=(409,))
    def post(self, request):
        data = UserCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        row = user_create(**data.validated_data)
        return Response(UserRowSerializer(row).data, status=status.HTTP_201_CREATED)


class UserDetailView(ApiView):
    """DELETE: remove a user and their API token; admins only (an admin's account only a superuser)."""

    permission_classes = [IsUserAdmin]

    @documented(summary="Remove a user and their API token; admins (staff) only, an admin only by a superuser",
                ok={204: None}, errors=(404,), parameters=USERNAME_IN_PATH)
    def delete(self, request, username: str):
        if request.user.get_username() == username:
            raise PermissionDenied(f"username: {username} is you; another admin removes your account")
        check_may_change(request, username, "account")
        user_remove(username=username)
        return Response(status=status.HTTP_204_NO_CONTENT)


class UserPasswordView(ApiView):
    """POST: a new password for a user: your own, or (an admin) anyone's."""

    permission_classes = [IsAuthenticated]

    @documented(summary="Set a user's console password: yours, or (an admin) anyone's", request=PasswordSerializer,
                ok={204: None}, errors=(404,), parameters=USERNAME_IN_PATH)
    def post(self, request, username: str):
        check_may_change(request, username, "password")
        data = PasswordSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        user_password_set(username=username, password=data.validated_data["password"])
        return Response(status=status.HTTP_204_NO_CONTENT)
