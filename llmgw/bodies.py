"""Every HTTP request's body, bounded in size and in time, before anything behind it reads a byte.

ASGI middleware in front of the fast lane and Django. A body over its limit is answered 413 at once (from
Content-Length when the client states it, else as soon as the bytes read pass the limit), and a body that
does not arrive within LLMGW_BODY_TIMEOUT_SECONDS is answered 408: a stranger can hold neither a worker
nor memory by sending too much or too slowly. What passes is handed on whole, in one message.
"""

from __future__ import annotations

import asyncio
import json
import time

from django.conf import settings

from llmgw.dependencies import heartbeat_lane

HEARTBEAT_PATH = "/api/v1/agents/heartbeat"


class BodyRefused(Exception):
    """The body was refused; `status` and `body` are the answer."""

    def __init__(self, status: int, detail: str, field: str):
        super().__init__(detail)
        self.status = status
        self.body = {"detail": detail, "field": field}


class Disconnected(Exception):
    """The client went away before its body was all there: there is no one to answer."""


def body_limit(scope) -> tuple[int, str]:
    """The most bytes this request's body may hold, and the field a refusal names."""
    if scope["path"] == HEARTBEAT_PATH:
        return settings.LLMGW_HEARTBEAT_MAX_BYTES, "heartbeat"
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE, "body"


def declared_length(scope) -> int | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def read_body(scope, receive) -> bytes:
    """The whole body, or BodyRefused (413 too large, 408 too slow), or Disconnected."""
    limit, field = body_limit(scope)
    declared = declared_length(scope)
    if declared is not None and declared > limit:
        raise BodyRefused(413, f"{field}: {declared} bytes is over the {limit}-byte limit", field)
    timeout = settings.LLMGW_BODY_TIMEOUT_SECONDS
    deadline = time.monotonic() + timeout
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.001))
        except TimeoutError:
            raise BodyRefused(
                408, f"{field}: not received within {timeout:g} seconds ({size} bytes arrived)", field
            ) from None
        if message["type"] != "http.request":
            raise Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyRefused(413, f"{field}: over the {limit}-byte limit ({size} bytes and more)", field)
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def send_json(send, status: int, body: dict, *, close: bool = False,
                    headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    payload = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()), *headers]
    if close:  # the rest of the body is never read: the connection cannot carry another request
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def whole(body: bytes, receive):
    """A `receive` that gives the body read already in one message, then whatever comes (a disconnect)."""
    sent = False

    async def replayed():
        nonlocal sent, body
        if not sent:
            sent = True
            given, body = body, b""  # the app keeps what it needs; a reference here would outlive the request
            return {"type": "http.request", "body": given, "more_body": False}
        return await receive()

    return replayed


async def bounded_body(scope, receive, send) -> bytes | None:
    """The whole body; None when there is nothing more to do (refused and answered, or the client gone)."""
    try:
        return await read_body(scope, receive)
    except BodyRefused as refused:
        await send_json(send, refused.status, refused.body, close=True)
    except Disconnected:
        pass
    return None


def has_body(scope) -> bool:
    return bool(declared_length(scope)) or any(key.lower() == b"transfer-encoding" for key, _ in scope.get("headers") or ())


def is_anonymous_api_call(scope) -> bool:
    """An API request with no credentials at all (no Authorization header, no session cookie): every API
    endpoint refuses it (401) before it looks at the body."""
    if not scope["path"].startswith("/api/"):
        return False
    cookie = f"{settings.SESSION_COOKIE_NAME}=".encode()
    for key, value in scope.get("headers") or ():
        key = key.lower()
        if key == b"authorization" or (key == b"cookie" and cookie in value):
            return False
    return True


def without_body(scope) -> dict:
    """``scope`` saying it has no body (its body is left unread)."""
    headers = [(k, v) for k, v in scope.get("headers") or () if k.lower() not in (b"content-length", b"transfer-encoding")]
    return {**scope, "headers": [*headers, (b"content-length", b"0")]}


def body_unread(receive):
    """A `receive` that gives an empty body, then nothing (what the client still sends is never read)."""
    given = False

    async def replayed():
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # until the server cancels the wait: the request is answered

    return replayed


def closing(send):
    """A `send` whose answer closes the connection (a body left unread cannot be followed by a request)."""

    async def sent(message):
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
        await send(message)

    return sent


class BoundedBodies:
    """ASGI middleware: read each HTTP body within its limits, then hand it to `app` whole.

    A body sent to the API by someone who gives no credentials is not read at all (one that says it is over
    the limit is still 413): the API refuses the request (401) before it would look at it; the app sees an
    empty body, and the connection closes.
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["path"] == HEARTBEAT_PATH:
            heartbeat_lane.set(True)  # this request's context only (each request runs in its own)
        declared = declared_length(scope)
        if has_body(scope) and is_anonymous_api_call(scope) and (declared is None or declared <= body_limit(scope)[0]):
            return await self.app(without_body(scope), body_unread(receive), closing(send))
        body = await bounded_body(scope, receive, send)
        if body is not None:
            replayed = whole(body, receive)
            del body  # whole() hands it over and lets it go
            await self.app(scope, replayed, send)
