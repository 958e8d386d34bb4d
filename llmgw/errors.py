"""Errors a person reads: every one names the field (or domain) and says what is wrong.

The API maps InvalidInput to 400 and Conflict to 409 with the same text the CLI prints.
"""

from __future__ import annotations

from typing import Any

# Characters of an offending value a refusal quotes: a refusal must not echo 256 KiB back. Here, below
# every layer (the pure kernel and the node agent import this module), so each quotes values one way.
SHOWN_CHARS = 40


def cut_short(text: str, longest: int) -> str:
    """``text`` within ``longest`` characters, an ellipsis where it was cut."""
    return text if len(text) <= longest else text[: longest - 1] + "…"


# Characters of any one text in an error body: a refusal that quotes what was sent (DRF's `"…" is not a valid
# choice.`, a key named in `errors`) is cut in its middle, so a 2 MB value is not echoed back (its own
# words at either end stay).
ERROR_TEXT_CHARS = 1000


def cut_middle(text: str, longest: int = ERROR_TEXT_CHARS) -> str:
    """``text`` within ``longest`` characters: its start and its end, an ellipsis where the middle was cut."""
    if len(text) <= longest:
        return text
    tail = longest // 3
    return text[: longest - tail - 1] + "…" + text[-tail:]


def error_body_cut(body: Any) -> Any:
    """An error body with every text in it (keys too) within ERROR_TEXT_CHARS characters."""
    if isinstance(body, str):
        return cut_middle(body)
    if isinstance(body, dict):
        return {error_body_cut(key): error_body_cut(value) for key, value in body.items()}
    if isinstance(body, list | tuple):
        return [error_body_cut(value) for value in body]
    return body


def value_shown(value: Any) -> str:
    """Any value a person sent, as a refusal quotes it: a float as %g, an integer of 400 digits by its
    size (str() of it may be refused, a float of it overflows), anything else its repr cut short."""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**20:
        return f"a number of about {int(value.bit_length() * 0.30103) + 1} digits"
    return cut_short(repr(value), SHOWN_CHARS)


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
