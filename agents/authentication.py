"""Node tokens: `Authorization: Token node_…` identifies a node's agent, which may write that node only."""

from __future__ import annotations

import time

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


# token hash → (node name, when the entry expires): a heartbeat every 10 s from every node would
# otherwise look its token up every time. A replaced token keeps working at most this long.
TOKEN_CACHE_SECONDS = 60
_token_cache: dict[str, tuple[str, float]] = {}
_tokens_learned_to = 0  # the highest token id node_tokens_learn has read


def forget_node_tokens() -> None:
    global _tokens_learned_to
    _token_cache.clear()
    _tokens_learned_to = 0


def node_tokens_recheck() -> None:
    """Check every cached node token again in one read: those still valid are kept another
    TOKEN_CACHE_SECONDS, the others dropped. Run off the requests' path (agents.asgi's lifespan, through
    the map's refresher), so a known node's heartbeat never goes to the database because its entry aged.
    """
    hashes = list(_token_cache)
    if not hashes:
        return
    # The whole table (a node's token each), not `key_hash IN (…)` of every cached one: with a large
    # fleet that statement's placeholders, one a node, would be built and sent in the refresher's thread,
    # under the GIL the heartbeats' event loop needs; the plain read costs far less.
    valid = dict(NodeToken.objects.values_list("key_hash", "node_name"))
    until = time.monotonic() + TOKEN_CACHE_SECONDS
    for key_hash in hashes:
        if key_hash in valid:
            _token_cache[key_hash] = (valid[key_hash], until)
        else:
            _token_cache.pop(key_hash, None)


def node_tokens_learn() -> int:
    """Cache every node token this process does not know yet (TOKEN_CACHE_SECONDS, then checked again
    like the others); how many. With agents.readings.learn_ready_nodes it lets a process's first
    heartbeat from a running node take the fast lane."""
    global _tokens_learned_to
    until = time.monotonic() + TOKEN_CACHE_SECONDS
    learned = 0
    # The tokens made since the last learning only (by id): the whole table every few seconds held the
    # GIL the event loop needs. A token made again for its node keeps its row: its first heartbeat here
    # is authenticated by Django, which caches it.
    rows = NodeToken.objects.filter(id__gt=_tokens_learned_to).values_list("id", "key_hash", "node_name")
    for token_id, key_hash, node_name in rows:
        _tokens_learned_to = max(_tokens_learned_to, token_id)
        if key_hash not in _token_cache:
            _token_cache[key_hash] = (node_name, until)
            learned += 1
    return learned


def cached_node_for(authorization: str) -> str | None:
    """The node a `Token …` header names, if this process knows the token (no database read)."""
    keyword, _, key = authorization.partition(" ")
    if keyword.lower() != "token" or not key:
        return None
    cached = _token_cache.get(NodeToken.hash_key(key.strip()))
    if cached and cached[1] > time.monotonic():
        return cached[0]
    return None


class NodeTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Token"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Authorization: write 'Token <the node token>'")
        key_hash = NodeToken.hash_key(header[1].decode(errors="replace"))
        cached = _token_cache.get(key_hash)
        if cached and cached[1] > time.monotonic():
            return NodeIdentity(cached[0]), None
        token = NodeToken.objects.filter(key_hash=key_hash).first()
        if token is None:
            raise exceptions.AuthenticationFailed("unknown node token (make one with: llmgw ctl node token NODE)")
        NodeToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
        _token_cache[key_hash] = (token.node_name, time.monotonic() + TOKEN_CACHE_SECONDS)
        return NodeIdentity(token.node_name), token

    def authenticate_header(self, request) -> str:
        return self.keyword


class NodeTokenScheme(OpenApiAuthenticationExtension):
    """Describes node tokens in the OpenAPI schema."""

    target_class = NodeTokenAuthentication
    name = "nodeToken"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "header", "name": "Authorization", "description": "Token node_…"}
