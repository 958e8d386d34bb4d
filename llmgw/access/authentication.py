"""`Authorization: Token <key>` for the API and /metrics: the key's hash looked up, an expired, rotated or
revoked token refused at once (401, saying which), and an address that keeps sending wrong keys slowed
(429) before it can guess."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.conf import settings
from django.core.cache import cache
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication

from llmgw.access import models as access
from llmgw.access.models import ApiToken, key_hash

log = logging.getLogger(__name__)

# A token's last use is written at most this often (not a database write for every request).
LAST_USED_EVERY = timedelta(minutes=1)
# A key longer than this is none of ours (40 hex digits): refused unread.
MAX_KEY = 200


class TokenRefused(exceptions.AuthenticationFailed):
    pass


def failures_key(address: str) -> str:
    return f"llmgw:token-failures:{address}"


# The wrong-token counter lives in the cache (Redis in production). Redis out of reach costs a request
# nothing: the counter is skipped, and not asked again for this long, as the answer would wait its timeout.
CACHE_RETRY_SECONDS = 30.0
_cache_down_until = 0.0


def _counter(call):
    """``call()`` on the cache, or None while (or once found) the cache is out of reach."""
    global _cache_down_until
    if time.monotonic() < _cache_down_until:
        return None
    try:
        return call()
    except Exception as exc:  # redis' ConnectionError, TimeoutError: the counter is a guard, not the answer
        _cache_down_until = time.monotonic() + CACHE_RETRY_SECONDS
        log.warning("wrong-token counter skipped for %g s: the cache is not reachable (%s)", CACHE_RETRY_SECONDS, exc)
        return None


def check_failures(address: str) -> None:
    """429 while `address` has sent LLMGW_TOKEN_FAILURES wrong keys within LLMGW_TOKEN_FAILURE_WINDOW."""
    if not address or not settings.LLMGW_TOKEN_FAILURES:
        return
    if (_counter(lambda: cache.get(failures_key(address))) or 0) >= settings.LLMGW_TOKEN_FAILURES:
        window = int(settings.LLMGW_TOKEN_FAILURE_WINDOW_SECONDS)
        raise exceptions.Throttled(
            wait=window,
            detail=f"Token: {settings.LLMGW_TOKEN_FAILURES} wrong tokens from {address} within {window} s.",
        )


def count_failure(address: str) -> None:
    if not address or not settings.LLMGW_TOKEN_FAILURES:
        return
    key = failures_key(address)
    window = settings.LLMGW_TOKEN_FAILURE_WINDOW_SECONDS

    def count() -> None:
        # The window starts at the first failure and is not extended by later ones.
        if not cache.add(key, 1, timeout=window):
            try:
                cache.incr(key)
            except ValueError:  # expired between the add and the incr
                cache.add(key, 1, timeout=window)

    _counter(count)


def token_user(key: str):
    """The active user whose token `key` is, or TokenRefused saying why not (no such token, expired, inactive)."""
    key = key.strip()
    if not key or len(key) > MAX_KEY:
        raise TokenRefused("Token: no such token (revoked, rotated or mistyped)")
    token = ApiToken.objects.select_related("user").filter(key_hash=key_hash(key)).first()
    if token is None:
        raise TokenRefused(
            "Token: no such token (revoked, rotated or mistyped); ask an admin for one: llmgw ctl token create"
        )
    at = access.now()
    if token.expires is not None and token.expires <= at:
        raise TokenRefused(
            f"Token: expired at {token.expires:%Y-%m-%d %H:%M} UTC; an admin gives it a new key: "
            f"llmgw ctl token rotate {token.user.username}"
        )
    if not token.user.is_active:
        raise TokenRefused(f"Token: the user {token.user.username} is inactive")
    if token.last_used is None or at - token.last_used >= LAST_USED_EVERY:
        ApiToken.objects.filter(pk=token.pk).update(last_used=at)
    return token.user


class ApiTokenAuthentication(TokenAuthentication):
    """DRF's `Token <key>` header, read against ApiToken (hashed keys, lifetimes)."""

    def authenticate(self, request):
        address = request.META.get("REMOTE_ADDR", "")
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if header.split(" ", 1)[0].lower() == self.keyword.lower():
            check_failures(address)
        try:
            return super().authenticate(request)
        except exceptions.AuthenticationFailed:
            count_failure(address)
            raise

    def authenticate_credentials(self, key):
        user = token_user(key)
        return user, None
