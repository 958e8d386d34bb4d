"""Console users (`llmgw ctl user create|list|set-password|remove`, /api/v1/users): a user made with a password
and a role logs in to the console; a new password refuses the old one at once; a removed user logs in no more."""

from __future__ import annotations

import io
import json

import pytest
from django.test import Client
from rest_framework.test import APIClient

from llmgw.ctl import main as ctl

pytestmark = pytest.mark.django_db(transaction=True)


def run(capsys, monkeypatch, *argv: str, stdin: str = "") -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = ctl(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def logs_in(username: str, password: str) -> bool:
    return Client().post("/login/", {"username": username, "password": password}).status_code == 302


def client_with(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def test_a_user_made_with_a_password_logs_in_with_their_role(capsys, monkeypatch):
    code, out, err = run(capsys, monkeypatch, "user", "create", "alice", "--role", "viewer", "--password-stdin",
                         stdin="alice-pass-9\n")
    assert (code, out, err) == (0, "user alice made (viewer): they log in to the console with that password\n", "")
    client = Client()
    assert client.post("/login/", {"username": "alice", "password": "alice-pass-9"}).status_code == 302
    assert client.get("/nodes/").status_code == 200
    assert not logs_in("alice", "wrong-pass-9")

    lines = run(capsys, monkeypatch, "user", "list")[1].splitlines()
    assert lines[0].split() == ["USER", "ROLE", "PASSWORD", "TOKEN", "LAST", "LOGIN"]
    assert lines[1].split()[:4] == ["alice", "viewer", "yes", "no"]
    rows = json.loads(run(capsys, monkeypatch, "user", "list", "-o", "json")[1])
    assert [(r["username"], r["role"], r["has_password"]) for r in rows] == [("alice", "viewer", True)]
    assert rows[0]["last_login"] is not None


def test_create_refuses_a_taken_name_a_short_password_and_a_password_it_cannot_ask_for(capsys, monkeypatch):
    assert run(capsys, monkeypatch, "user", "create", "alice", "--role", "operator", "--password-stdin",
               stdin="alice-pass-9\n")[0] == 0
    code, _, err = run(capsys, monkeypatch, "user", "create", "alice", "--role", "viewer", "--password-stdin",
                       stdin="other-pass-9\n")
    assert (code, err) == (1, "error: username: alice exists (llmgw ctl user set-password alice gives a new password)\n")
    code, _, err = run(capsys, monkeypatch, "user", "create", "bob", "--role", "viewer", "--password-stdin",
                       stdin="short\n")
    assert (code, err) == (1, "error: password: This password is too short. It must contain at least 8 characters.\n")
    # Standard input is no terminal (a script): the password is never asked for there, nor taken from argv.
    code, _, err = run(capsys, monkeypatch, "user", "create", "bob", "--role", "viewer")
    assert (code, err) == (
        1, "error: password: standard input is not a terminal; give --password-stdin to read it from there\n"
    )
    assert [r["username"] for r in json.loads(run(capsys, monkeypatch, "user", "list", "-o", "json")[1])] == ["alice"]


def test_a_new_password_refuses_the_old_one_and_a_removed_user_is_refused(capsys, monkeypatch):
    from llmgw.users import token_create

    run(capsys, monkeypatch, "user", "create", "alice", "--role", "operator", "--password-stdin", stdin="first-pass-9\n")
    key = token_create(username="alice", role="operator")
    code, out, _ = run(capsys, monkeypatch, "user", "set-password", "alice", "--password-stdin", stdin="second-pass-9\n")
    assert (code, out) == (0, "password of alice set: the old one is refused from now\n")
    assert not logs_in("alice", "first-pass-9")
    assert logs_in("alice", "second-pass-9")

    code, out, _ = run(capsys, monkeypatch, "user", "remove", "alice")
    assert (code, out) == (0, "user alice removed, with their API token\n")
    assert not logs_in("alice", "second-pass-9")
    assert client_with(key).get("/api/v1/nodes").status_code == 401
    capsys.readouterr()
    code, _, err = run(capsys, monkeypatch, "user", "remove", "alice")
    assert (code, err) == (1, "error: username: no user alice (llmgw ctl user list names them)\n")


def test_api_an_admin_makes_and_removes_users_and_a_user_sets_only_their_own_password():
    from django.contrib.auth import get_user_model

    from llmgw.users import token_create

    get_user_model().objects.create_superuser("root", "", "root-pass-9")
    root = client_with(token_create(username="root", role="operator", expires="never"))
    made = root.post("/api/v1/users", {"username": "alice", "role": "viewer", "password": "alice-pass-9"}, format="json")
    assert made.status_code == 201
    assert made.json() == {"username": "alice", "role": "viewer", "has_password": True, "has_token": False,
                           "last_login": None}
    bad = root.post("/api/v1/users", {"username": "bob", "role": "viewer", "password": "short"}, format="json")
    assert bad.status_code == 400
    assert (bad.json()["field"], bad.json()["detail"]) == (
        "password", "password: This password is too short. It must contain at least 8 characters."
    )
    # The schema says so before a client sends (the schema fuzz draws passwords from it).
    schema = root.get("/api/v1/schema", HTTP_ACCEPT="application/json").json()
    assert schema["components"]["schemas"]["UserCreateRequest"]["properties"]["password"]["minLength"] == 8
    assert schema["components"]["schemas"]["PasswordRequest"]["properties"]["password"]["minLength"] == 8
    assert "bob" not in [r["username"] for r in root.get("/api/v1/users").json()]

    alice = client_with(token_create(username="alice", role="viewer"))
    refused = alice.get("/api/v1/users")
    assert refused.status_code == 403
    assert refused.json()["detail"] == (
        "your role does not allow this: users are made, listed and removed by an admin (a staff user)"
    )
    other = alice.post("/api/v1/users/root/password", {"password": "taken-over-9"}, format="json")
    assert other.status_code == 403
    assert other.json()["detail"] == (
        "username: root is not you; only an admin (a staff user) changes another's password"
    )
    assert alice.post("/api/v1/users/alice/password", {"password": "alice-new-9"}, format="json").status_code == 204
    assert logs_in("alice", "alice-new-9")

    itself = root.delete("/api/v1/users/root")
    assert (itself.status_code, itself.json()["detail"]) == (
        403, "username: root is you; another admin removes your account"
    )
    assert root.delete("/api/v1/users/alice").status_code == 204
    assert not logs_in("alice", "alice-new-9")
