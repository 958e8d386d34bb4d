"""Node tokens: `Authorization: Token node_…` identifies a node's agent, which may write that node only."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from agents.models import NodeToken


class NodeIdentity:
    """The authenticated caller of the heartbeat API: a node, not a person."""

    is_authenticated = True
    is_staff = False
    is_superuser = False

    def __init__(self, node_name: str):
        self.node_name = node_name
        self.username = f"node:{node_name}"

    def __str__(self) -> str:
        return self.username


class NodeTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Token"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Authorization: write 'Token <the node token>'")
        key = header[1].decode(errors="replace")
        token = NodeToken.objects.filter(key_hash=NodeToken.hash_key(key)).first()
        if token is None:
            raise exceptions.AuthenticationFailed("unknown node token (make one with: llmgw ctl node token NODE)")
        now = timezone.now()
        if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
            NodeToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return NodeIdentity(token.node_name), token

    def authenticate_header(self, request) -> str:
        return self.keyword


class NodeTokenScheme(OpenApiAuthenticationExtension):
    """Describes node tokens in the OpenAPI schema."""

    target_class = NodeTokenAuthentication
    name = "nodeToken"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "header", "name": "Authorization", "description": "Token node_…"}
