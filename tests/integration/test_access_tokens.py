"""API tokens that expire, and that a user or an admin rotates or revokes (`llmgw ctl token …`, /api/v1/tokens):
a token past its lifetime, rotated away or revoked is refused at once, with words saying which."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from rest_framework.test import APIClient

from llmgw.access import models as access
from llmgw.ctl import main as ctl

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock(monkeypatch):
    """The tokens' clock, moved by the test."""
    at = {"now": T0}
    monkeypatch.setattr(access, "now", lambda: at["now"])

    def move(**delta):
        at["now"] += timedelta(**delta)

    return move


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = ctl(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def client_with(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


@pytest.fixture
def admin_key():
    from django.contrib.auth import get_user_model

    from llmgw.users import token_create

    get_user_model().objects.create_superuser("root", "", "root-pass-9")
    return token_create(username="root", role="operator", expires="never")


def test_a_token_expires_after_its_lifetime_default_90_days(clock, capsys):
    code, out, _ = run(capsys, "token", "create", "alice", "--role", "viewer")
    key = out.strip()
    assert code == 0 and len(key) == 40
    clock(days=89, hours=23)
    assert client_with(key).get("/api/v1/nodes").status_code == 200
    clock(hours=1)
    answer = client_with(key).get("/api/v1/nodes")
    assert answer.status_code == 401
    assert answer.json()["detail"] == (
        "Token: expired at 2026-05-30 12:00 UTC; an admin gives it a new key: llmgw ctl token rotate alice"
    )


def test_expires_given_or_never(clock, capsys):
    key = run(capsys, "token", "create", "bob", "--expires", "30d")[1].strip()
    forever = run(capsys, "token", "create", "carol", "--expires", "never")[1].strip()
    clock(days=30)
    assert client_with(key).get("/api/v1/nodes").status_code == 401
    clock(days=3650 * 3)
    assert client_with(forever).get("/api/v1/nodes").status_code == 200
    capsys.readouterr()
    code, _, err = run(capsys, "token", "create", "dave", "--expires", "soon")
    assert (code, err) == (
        1, "error: expires: 'soon' is not a lifetime; write 1 to 9999 and d, h or m (e.g. 90d, 12h, 30m), or never\n"
    )


def test_a_new_create_or_a_rotate_gives_a_new_key_and_the_old_one_stops_at_once(clock, capsys):
    first = run(capsys, "token", "create", "alice", "--role", "operator")[1].strip()
    second = run(capsys, "token", "create", "alice", "--role", "operator")[1].strip()
    assert first != second
    third = run(capsys, "token", "rotate", "alice")[1].strip()
    assert third not in (first, second)
    for old in (first, second):
        answer = client_with(old).get("/api/v1/nodes")
        assert answer.status_code == 401
        assert answer.json()["detail"] == (
            "Token: no such token (revoked, rotated or mistyped); ask an admin for one: llmgw ctl token create"
        )
    assert client_with(third).get("/api/v1/nodes").status_code == 200


def test_revoke_refuses_the_token_at_once_and_keeps_the_user(capsys):
    from django.contrib.auth import get_user_model

    key = run(capsys, "token", "create", "alice", "--role", "operator")[1].strip()
    assert client_with(key).get("/api/v1/nodes").status_code == 200
    assert run(capsys, "token", "revoke", "alice") == (0, "token of alice revoked\n", "")
    assert client_with(key).get("/api/v1/nodes").status_code == 401
    assert get_user_model().objects.filter(username="alice").exists()
    capsys.readouterr()
    code, _, err = run(capsys, "token", "revoke", "alice")
    assert (code, err) == (1, "error: username: alice has no API token (llmgw ctl token create alice)\n")


def test_list_shows_user_role_created_last_used_and_expires(clock, capsys):
    alice = run(capsys, "token", "create", "alice", "--role", "operator")[1].strip()
    bob = run(capsys, "token", "create", "bob", "--role", "viewer", "--expires", "never")[1].strip()
    clock(hours=2)
    client_with(alice).get("/api/v1/nodes")
    lines = run(capsys, "token", "list")[1].splitlines()
    assert lines == [
        "USER   ROLE      KEY        CREATED           LAST USED         EXPIRES",
        f"alice  operator  {alice[:8]}…  2026-03-01 12:00  2026-03-01 14:00  2026-05-30 12:00",
        f"bob    viewer    {bob[:8]}…  2026-03-01 12:00  -                 never",
    ]
    rows = json.loads(run(capsys, "token", "list", "-o", "json")[1])
    assert [(r["username"], r["expired"]) for r in rows] == [("alice", False), ("bob", False)]
    clock(days=90)
    assert run(capsys, "token", "list")[1].splitlines()[1].endswith("expired 2026-05-30 12:00")


def test_api_a_user_lists_rotates_and_revokes_only_their_own(admin_key):
    from llmgw.users import token_create

    alice = token_create(username="alice", role="operator")
    token_create(username="bob", role="viewer")
    mine = client_with(alice).get("/api/v1/tokens")
    assert [r["username"] for r in mine.json()] == ["alice"]
    assert [r["username"] for r in client_with(admin_key).get("/api/v1/tokens").json()] == ["alice", "bob", "root"]

    refused = client_with(alice).post("/api/v1/tokens/bob/rotate", {}, format="json")
    assert refused.status_code == 403
    assert refused.json()["detail"] == "username: bob is not you; only an admin (a staff user) changes another's token"
    assert client_with(alice).delete("/api/v1/tokens/bob").status_code == 403

    rotated = client_with(alice).post("/api/v1/tokens/alice/rotate", {"expires": "1d"}, format="json")
    assert rotated.status_code == 200
    assert client_with(alice).get("/api/v1/tokens").status_code == 401
    new = rotated.json()["token"]
    assert client_with(new).get("/api/v1/tokens").status_code == 200
    assert client_with(admin_key).delete("/api/v1/tokens/alice").status_code == 204
    assert client_with(new).get("/api/v1/tokens").status_code == 401

    bad = client_with(admin_key).post("/api/v1/tokens", {"username": "eve", "role": "viewer", "expires": "0d"},
                                      format="json")
    assert (bad.status_code, bad.json()["field"]) == (400, "expires")
    assert bad.json()["detail"] == (
        "expires: '0d' is not a lifetime; write 1 to 9999 and d, h or m (e.g. 90d, 12h, 30m), or never"
    )


def test_metrics_refuses_an_expired_token(clock):
    from llmgw.users import token_create

    key = token_create(username="prom", role="viewer", expires="1h")
    assert APIClient().get("/metrics", HTTP_AUTHORIZATION=f"Token {key}").status_code == 200
    clock(hours=1)
    assert APIClient().get("/metrics", HTTP_AUTHORIZATION=f"Token {key}").status_code == 401


def test_wrong_tokens_from_one_address_are_slowed(settings):
    from django.core.cache import cache

    cache.clear()
    settings.LLMGW_TOKEN_FAILURES = 5
    wrong = client_with("0" * 40)
    assert [wrong.get("/api/v1/nodes").status_code for _ in range(6)] == [401] * 5 + [429]
    answer = wrong.get("/api/v1/nodes")
    assert answer.json()["detail"] == (
        "Token: 5 wrong tokens from 127.0.0.1 within 300 s. Expected available in 300 seconds."
    )
    cache.clear()
