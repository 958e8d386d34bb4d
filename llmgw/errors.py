"""Errors a person reads: every one names the field (or domain) and says what is wrong.

The API maps InvalidInput to 400 and Conflict to 409 with the same text the CLI prints.
"""

from __future__ import annotations


class LlmgwError(Exception):
    """Base of the errors the services raise for people to read."""

    status = 400

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field

    def as_dict(self) -> dict[str, str]:
        body = {"detail": self.message}
        if self.field:
            body["field"] = self.field
        return body


class InvalidInput(LlmgwError):
    """Bad input: nothing of it was applied."""


class NotFound(LlmgwError):
    status = 404


class Conflict(LlmgwError):
    status = 409


class Forbidden(LlmgwError):
    """Allowed to some users, not to this one: nothing was applied."""

    status = 403


# SQLSTATEs of a write that lost to another at the same time: deadlock, serialization, lock not available.
WRITE_CONFLICT_STATES = frozenset({"40P01", "40001", "55P03"})
WRITE_CONFLICT_TEXT = "the write conflicted with another one at the same time; nothing was changed, try again"


def is_write_conflict(exc: BaseException) -> bool:
    """A database error that says another writer was in the way (PostgreSQL deadlock or serialization,
    SQLite's "database is locked"): worth a retry, and a 409 to a client, never a 500."""
    for error in (exc, exc.__cause__):
        if error is None:
            continue
        if getattr(error, "sqlstate", None) in WRITE_CONFLICT_STATES:
            return True
        if "database is locked" in str(error) or "deadlock detected" in str(error):
            return True
    return False
