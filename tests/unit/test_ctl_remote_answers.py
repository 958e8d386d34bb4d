"""`llmgw ctl --server URL` pointed at a server that is not llmgw's: one `error:` line, never a traceback."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from llmgw.ctl import main as ctl

ANSWERS = {
    "/api/v1/nodes": (200, b"<!doctype html><title>Some other app</title>"),
    "/api/v1/models": (200, b"[" * 100_000 + b"]" * 100_000),
    "/api/v1/replicas": (400, b"[" * 100_000),
}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        code, body = ANSWERS[self.path.partition("?")[0]]
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def other_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize(
    ("command", "said"),
    [
        ("nodes", "answered GET /api/v1/nodes with no JSON: is it llmgw's address?"),
        ("models", "answered GET /api/v1/models with no JSON: is it llmgw's address?"),
        ("replicas", "the server answered 400"),
    ],
)
def test_an_answer_that_is_no_json_of_llmgw_is_one_error_line(other_server, command, said, capsys, monkeypatch):
    monkeypatch.setenv("LLMGW_TOKEN", "x")
    assert ctl(["--server", other_server, command]) == 1
    said = said if command == "replicas" else f"{other_server} {said}"
    assert capsys.readouterr().err == f"error: {said}\n"


SHAPES = {"/api/v1/nodes": b'{"hello": 1}', "/api/v1/models": b"[1, 2]", "/api/v1/replicas": b'"text"',
          "/api/v1/facility": b"[]"}


class ShapeHandler(Handler):
    def do_GET(self):
        body = SHAPES[self.path.partition("?")[0]]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def json_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), ShapeHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize(("command", "path"), [("nodes", "nodes"), ("models", "models"), ("replicas", "replicas")])
def test_json_of_another_shape_is_one_error_line_naming_the_address(json_server, command, path, capsys, monkeypatch):
    monkeypatch.setenv("LLMGW_TOKEN", "x")
    assert ctl(["--server", json_server, command]) == 1
    assert capsys.readouterr().err == (
        f"error: {json_server} answered GET /api/v1/{path} with JSON of a shape llmgw's API does not answer: "
        "is it llmgw's address?\n"
    )
