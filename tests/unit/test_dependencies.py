"""Which database errors say PostgreSQL is down (a 503), and which are the statement's own (not)."""

from __future__ import annotations

import sqlite3

import psycopg
import pytest
from psycopg import errors
from psycopg_pool import PoolTimeout

from llmgw.dependencies import is_database_unavailable


def wrapped(cause: BaseException) -> Exception:
    """As Django raises it: its own class, psycopg's error as the cause."""
    from django.db.utils import OperationalError

    error = OperationalError(str(cause))
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(
    "cause",
    [
        PoolTimeout("couldn't get a connection after 4.00 sec"),
        psycopg.OperationalError("connection failed: Connection refused"),
        psycopg.OperationalError("consuming input failed: server closed the connection unexpectedly"),
        errors.AdminShutdown("terminating connection due to administrator command"),
        errors.CannotConnectNow("the database system is starting up"),
        errors.TooManyConnections("sorry, too many clients already"),
        psycopg.InterfaceError("the connection is lost"),
    ],
)
def test_the_server_gone_or_out_of_reach_is_unavailable(cause):
    assert is_database_unavailable(wrapped(cause))


@pytest.mark.parametrize(
    "cause",
    [
        errors.DeadlockDetected("deadlock detected"),  # a write conflict: 409, not 503
        errors.SerializationFailure("could not serialize access"),
        errors.LockNotAvailable("could not obtain lock"),
        errors.QueryCanceled("canceling statement due to statement timeout"),
        errors.UniqueViolation("duplicate key"),
        psycopg.InterfaceError("the cursor is closed"),
        sqlite3.OperationalError("database is locked"),
        sqlite3.OperationalError("unable to open database file"),
    ],
)
def test_a_statement_refused_is_not(cause):
    assert not is_database_unavailable(wrapped(cause))


def test_errors_of_other_kinds_are_not():
    assert not is_database_unavailable(ValueError("no"))
    assert not is_database_unavailable(RuntimeError("connection"))
