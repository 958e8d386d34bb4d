"""An API token: one per user, kept as a hash (the key itself is shown once, when made or rotated)."""

from __future__ import annotations

import hashlib
from datetime import datetime

from django.conf import settings
from django.db import models
from django.utils import timezone

# What `llmgw ctl token list` shows of a key: enough to tell two apart, too little to use.
PREFIX_CHARS = 8


def now() -> datetime:
    """The time tokens are made, used and expire by: one place, so a test can move it."""
    return timezone.now()


def key_hash(key: str) -> str:
    """The stored form of a key (SHA-256, hex): a key is 160 random bits, so no salt or slow hash is needed,
    and a copy of the database holds no key anyone can send."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


class ApiToken(models.Model):
    """A user's API token (`Authorization: Token <key>`): refused once `expires` has passed (never when
    null), and gone at once when revoked or rotated."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_token")
    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=PREFIX_CHARS)
    created = models.DateTimeField()
    last_used = models.DateTimeField(null=True, blank=True)
    expires = models.DateTimeField(null=True, blank=True, help_text="empty: never")

    class Meta:
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"
