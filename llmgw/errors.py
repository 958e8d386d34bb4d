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
