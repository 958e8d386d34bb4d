"""REST API of API tokens: POST /api/v1/tokens, an admin's (llmgw ctl token create in remote mode)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from facility.serializers import StrictSerializer
from llmgw.api import ApiView, TextField, documented
from llmgw.permissions import ROLES, IsAdmin
from llmgw.users import MAX_USERNAME, is_admin_account, token_create


@extend_schema_field({"type": "string", "pattern": r"^[\w.@+-]+$", "maxLength": MAX_USERNAME})
class UsernameField(TextField):
    """A username as the admin takes one (Django's validator): the schema states its form, the service checks it."""


class TokenCreateSerializer(StrictSerializer):
    username = UsernameField(max_length=MAX_USERNAME, help_text="made if missing; letters, digits and @ . + - _")
    role = serializers.ChoiceField(choices=ROLES, help_text="the user's one role from now (viewer or operator)")


class TokenSerializer(serializers.Serializer):
    username = serializers.CharField()
    role = serializers.ChoiceField(choices=ROLES)
    token = serializers.CharField(help_text="send as 'Authorization: Token <key>'; the user's one token")


class TokenListView(ApiView):
    """POST: a user's API token with a role, the user made if missing; admins only."""

    permission_classes = [IsAdmin]

    @documented(
        summary="An API token for a user (made if missing) with a role; admins (staff) only",
        request=TokenCreateSerializer, ok={200: TokenSerializer}, errors=(409,),
    )
    def post(self, request):
        data = TokenCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        username, role = data.validated_data["username"], data.validated_data["role"]
        # A staff user's token is the admin's rights: only a superuser hands one out here.
        if is_admin_account(username) and not request.user.is_superuser:
            raise PermissionDenied(f"username: {username} is an admin; only a superuser gives out an admin's token")
        return Response({"username": username, "role": role, "token": token_create(username=username, role=role)})
