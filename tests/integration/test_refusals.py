"""Refusals cost nothing: a body from no one known is never read, a body past its limit is read no
further, a body handed on is not kept once its request is answered, and an error body never echoes a
large value back. ASGI-level tests drive llmgw.bodies.BoundedBodies with a client that counts what was
taken from it; bench/refusals.py gives the figures against a real server."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc

import pytest

from llmgw.bodies import BoundedBodies
from llmgw.errors import ERROR_TEXT_CHARS

MB2 = b"{" + b" " * 1_999_998 + b"}"


def scope_of(path: str, *, headers: list[tuple[bytes, bytes]]) -> dict:
    return {"type": "http", "method": "POST", "path": path, "headers": headers, "query_string": b""}


class Client:
    """An ASGI client sending ``body`` in 64 KiB messages (or without end), counting what the server took."""

    def __init__(self, body: bytes | None, *, piece: int = 65536):
        self.body = body
        self.piece = piece
        self.taken = 0
        self.sent: list[dict] = []

    async def receive(self) -> dict:
        if self.body is None:  # a body without end
            self.taken += self.piece
            return {"type": "http.request", "body": b"x" * self.piece, "more_body": True}
        chunk = self.body[self.taken:self.taken + self.piece]
        self.taken += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": self.taken < len(self.body)}

    async def send(self, message: dict) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return self.sent[0]["status"]

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.sent[0]["headers"])


async def answer_401(scope, receive, send):
    """The API's answer to a request without credentials: it never asks for the body."""
    await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"detail": "Authentication credentials were not provided."}'})


def test_a_body_sent_to_the_api_with_no_credentials_is_never_read():
    seen = []

    async def app(scope, receive, send):
        seen.append((dict(scope["headers"]).get(b"content-length"), await receive()))
        await answer_401(scope, receive, send)

    client = Client(MB2)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(MB2)).encode())]
    asyncio.run(BoundedBodies(app)(scope_of("/api/v1/facility/conditions", headers=headers), client.receive,
                                   client.send))
    assert client.taken == 0
    assert seen == [(b"0", {"type": "http.request", "body": b"", "more_body": False})]
    # The body is left unread: no other request can follow on this connection.
    assert client.status == 401 and client.headers[b"connection"] == b"close"


@pytest.mark.parametrize("credentials", [(b"authorization", b"Token x"), (b"cookie", b"sessionid=abc")])
def test_a_body_sent_with_credentials_is_read_and_handed_on(credentials):
    got = []

    async def app(scope, receive, send):
        got.append(await receive())
        await answer_401(scope, receive, send)

    client = Client(b'{"a": 1}')
    headers = [(b"content-length", b"8"), credentials]
    asyncio.run(BoundedBodies(app)(scope_of("/api/v1/facility/conditions", headers=headers), client.receive,
                                   client.send))
    assert got == [{"type": "http.request", "body": b'{"a": 1}', "more_body": False}]
    assert b"connection" not in client.headers


def test_a_chunked_body_past_its_limit_is_read_no_further_and_refused():
    from django.conf import settings

    async def app(scope, receive, send):  # pragma: no cover - never reached
        raise AssertionError("the app was handed a body past its limit")

    client = Client(None)
    headers = [(b"transfer-encoding", b"chunked"), (b"authorization", b"Token x")]
    asyncio.run(BoundedBodies(app)(scope_of("/api/v1/agents/heartbeat", headers=headers), client.receive,
                                   client.send))
    assert client.status == 413
    assert settings.LLMGW_HEARTBEAT_MAX_BYTES < client.taken <= settings.LLMGW_HEARTBEAT_MAX_BYTES + 65536


def test_a_body_handed_on_is_not_kept_once_its_request_is_answered():
    """The app may leave its objects in a reference cycle (an exception's traceback does) that only the
    collector's rare full pass frees: the body it was handed must not be held by them."""
    kept = []

    async def app(scope, receive, send):
        message = await receive()
        assert len(message["body"]) == len(MB2)
        del message
        cycle: dict = {"receive": receive}
        cycle["self"] = cycle
        kept.append(cycle)  # found later by nothing but the collector
        kept.clear()
        await answer_401(scope, receive, send)

    headers = [(b"content-length", str(len(MB2)).encode()), (b"authorization", b"Token x")]
    gc.disable()
    tracemalloc.start()
    try:
        client = Client(MB2)
        before = tracemalloc.get_traced_memory()[0]
        asyncio.run(BoundedBodies(app)(scope_of("/api/v1/facility/conditions", headers=headers), client.receive,
                                       client.send))
        del client
        left = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
        gc.enable()
        gc.collect()
    assert left < 500_000, f"{left:,} bytes still held after the request"


@pytest.mark.django_db
def test_a_refusal_never_echoes_a_large_value(admin_client):
    value = "x" * 2_000_000
    answer = admin_client.post(
        "/api/v1/facility/conditions", {"domain": "rack:r1", "condition": value, "reason": "r"},
        content_type="application/json",
    )
    assert answer.status_code == 400
    assert len(answer.content) < 5_000  # of a 2 MB value
    body = answer.json()
    assert body["field"] == "condition"
    assert body["detail"].startswith('condition: "xxxx') and body["detail"].endswith('xxxx" is not a valid choice.')
    assert len(body["detail"]) == ERROR_TEXT_CHARS
    assert body["errors"]["condition"][0].endswith('xxxx" is not a valid choice.')


@pytest.mark.django_db
def test_a_refusal_names_a_long_key_cut_short(admin_client):
    answer = admin_client.post(
        "/api/v1/facility/conditions", {"domain": "rack:r1", "condition": "hot", "reason": "r", "k" * 100_000: 1},
        content_type="application/json",
    )
    assert answer.status_code == 400
    assert len(answer.content) < 5_000  # of a 2 MB key
