"""Every call llmgw makes to another system is bounded: a total deadline and a size cap.

A read timeout alone bounds nothing: a server that sends its headers and then one byte every two
seconds never lets a 5-second read timeout fire. So the body is read in pieces, the deadline checked
between them and each piece's wait bounded by what is left of it; the body is cut at ``max_bytes``.
A call that passes either bound raises :class:`OutboundError`, whose text says which, so the caller
marks that source down with the reason. Pure: no Django (the node agent uses it too).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# Read this much at a time: small enough that the deadline is looked at often.
CHUNK_BYTES = 64 * 1024


class OutboundError(Exception):
    """A call to another system that failed or passed a bound; the text is the reason a person reads."""


@dataclass(frozen=True, slots=True)
class Answer:
    """What the other system answered, read whole within the bounds."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        import json

        try:
            return json.loads(self.body)
        except ValueError as exc:
            raise OutboundError(f"answered HTTP {self.status} with no JSON ({exc})") from None


def read_within(read: Callable[[int], bytes], *, deadline_at: float, max_bytes: int, what: str = "the answer") -> bytes:
    """Call ``read(n)`` until it returns b"", the deadline (a ``time.monotonic()``) passes or more than
    ``max_bytes`` came: the body, or OutboundError saying which bound it passed.

    ``read`` must return what has arrived (up to n bytes), not wait for n: ``read1``, not ``read``.
    """
    chunks: list[bytes] = []
    size = 0
    while True:
        if time.monotonic() > deadline_at:
            raise OutboundError(f"{what} took longer than its deadline (cut after {size:,} bytes)")
        chunk = read(CHUNK_BYTES)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            raise OutboundError(f"{what} is larger than {max_bytes:,} bytes")
        chunks.append(chunk)


def is_time_limit(exc: BaseException) -> bool:
    """Whether ``exc`` is a task's time limit (Celery's soft limit): never swallowed as a source's failure."""
    return type(exc).__name__ in ("SoftTimeLimitExceeded", "TimeLimitExceeded")


def get(
    client: Any,
    url: str,
    *,
    deadline_seconds: float,
    max_bytes: int,
    params: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
) -> Answer:
    """GET ``url`` through an httpx ``client`` within ``deadline_seconds`` in all and ``max_bytes``.

    Each wait (connect, each read) is bounded by what is left of the deadline, and the deadline is
    checked between reads, so the call returns or raises within about the deadline.
    """
    import httpx

    started = time.monotonic()
    deadline_at = started + deadline_seconds

    def left() -> float:
        return max(0.05, deadline_at - time.monotonic())

    try:
        timeout = httpx.Timeout(left())
        with client.stream("GET", url, params=params, headers=headers, timeout=timeout) as response:
            stream = response.iter_bytes()  # as it arrives: a chunk size would wait to fill it

            def read(_: int) -> bytes:
                return next(stream, b"")

            body = read_within(read, deadline_at=deadline_at, max_bytes=max_bytes)
            return Answer(response.status_code, dict(response.headers), body)
    except httpx.TimeoutException:
        raise OutboundError(f"no answer within {deadline_seconds:g} s") from None
    except httpx.HTTPError as exc:
        raise OutboundError(f"{type(exc).__name__}: {str(exc)[:200]}") from None
