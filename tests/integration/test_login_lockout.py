"""Logins, the console's and the admin's, are throttled: after 10 failures for one username, or from one
address, logins are refused for 15 minutes with the reason on the login page; `llmgw ctl user unlock` lifts it."""

from __future__ import annotations

import pytest
from django.test import Client

from llmgw.ctl import main as ctl

pytestmark = pytest.mark.django_db(transaction=True)

LOCKED = (
    "Too many failed logins (10) for this username or from this address: logins are refused for 15 minutes. "
    "An admin can lift it sooner: llmgw ctl user unlock USERNAME."
)


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice", password="right-pass-9")


def log_in(path: str, username: str, password: str, address: str):
    return Client(REMOTE_ADDR=address).post(path, {"username": username, "password": password})


def test_ten_wrong_passwords_lock_the_username_even_from_other_addresses(alice):
    answers = [log_in("/login/", "alice", f"guess-{n}", f"10.0.0.{n}").status_code for n in range(10)]
    assert answers == [200] * 9 + [429]  # the form again, "did not match"; the tenth says locked
    locked = log_in("/login/", "alice", "right-pass-9", "10.0.1.1")
    assert locked.status_code == 429
    assert LOCKED in locked.content.decode()
    # Another user from a fresh address is not locked out by alice's failures.
    bob_user = type(alice).objects.create_user("bob", password="bob-pass-99")
    assert log_in("/login/", bob_user.username, "bob-pass-99", "10.0.2.1").status_code == 302


def test_ten_failures_from_one_address_lock_it_in_the_admin_too(alice):
    answers = [log_in("/admin/login/", f"nobody{n}", "guess", "192.0.2.7").status_code for n in range(10)]
    assert answers == [200] * 9 + [429]
    locked = log_in("/admin/login/", "alice", "right-pass-9", "192.0.2.7")
    assert locked.status_code == 429
    assert LOCKED in locked.content.decode()
    assert log_in("/login/", "alice", "right-pass-9", "192.0.2.8").status_code == 302


def test_unlock_lets_the_user_in_again(alice, capsys):
    for n in range(10):
        log_in("/login/", "alice", "guess", f"10.0.3.{n}")
    assert log_in("/login/", "alice", "right-pass-9", "10.0.3.99").status_code == 429
    capsys.readouterr()
    assert ctl(["user", "unlock", "alice"]) == 0
    assert capsys.readouterr().out == "alice unlocked: their failed logins are forgotten\n"
    assert log_in("/login/", "alice", "right-pass-9", "10.0.3.99").status_code == 302
    assert ctl(["user", "unlock", "alice"]) == 0
    assert capsys.readouterr().out == "alice had no failed logins recorded\n"
