"""`llmgw ctl --server URL` may come anywhere on the line, kubectl-style."""

import pytest

from llmgw import remote
from llmgw.ctl import server_first
from llmgw.errors import InvalidInput


def test_server_moves_first_from_anywhere():
    assert server_first(["login", "--server", "http://a", "--token-file", "f"]) == [
        "--server", "http://a", "login", "--token-file", "f"
    ]
    assert server_first(["nodes", "--server=http://b", "-o", "json"]) == ["--server=http://b", "nodes", "-o", "json"]
    assert server_first(["nodes", "--domain", "rack:r1"]) == ["nodes", "--domain", "rack:r1"]


def test_a_server_address_is_taken_as_people_copy_it(monkeypatch):
    monkeypatch.setattr(remote, "token_load", lambda: None)
    assert remote.remote_from("HTTP://127.0.0.1:8000").url == "http://127.0.0.1:8000"
    assert remote.remote_from("https://cp.example/api/v1/").url == "https://cp.example"
    assert remote.remote_from("http://cp.example/").url == "http://cp.example"


def test_a_server_address_that_is_no_http_url_says_what_is_wrong():
    with pytest.raises(InvalidInput, match=r"served over http:// or https://, not ftp://"):
        remote.remote_from("ftp://x")
    with pytest.raises(InvalidInput, match=r"has no scheme; write http://cp:8000 \(or https://\)"):
        remote.remote_from("cp:8000")
    with pytest.raises(InvalidInput, match=r"names no host; write http://HOST:PORT"):
        remote.remote_from("http://")
