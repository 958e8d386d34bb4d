"""`llmgw ctl --server URL` may come anywhere on the line, kubectl-style."""

from llmgw.ctl import server_first


def test_server_moves_first_from_anywhere():
    assert server_first(["login", "--server", "http://a", "--token-file", "f"]) == [
        "--server", "http://a", "login", "--token-file", "f"
    ]
    assert server_first(["nodes", "--server=http://b", "-o", "json"]) == ["--server=http://b", "nodes", "-o", "json"]
    assert server_first(["nodes", "--domain", "rack:r1"]) == ["nodes", "--domain", "rack:r1"]
