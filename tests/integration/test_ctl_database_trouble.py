"""Local ctl against a database it cannot use says so in one line, at once: no traceback, no 30 s wait."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import pytest

LLMGW = str(Path(sys.executable).with_name("llmgw"))


def ctl(*args: str, database_url: str | None = None, data_dir: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "LLMGW_CONFIG", "LLMGW_URL"}}
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    if data_dir is not None:
        env["LLMGW_DATA_DIR"] = str(data_dir)
    return subprocess.run([LLMGW, "ctl", *args], env=env, capture_output=True, text=True, timeout=60)


def test_a_data_directory_without_a_database_is_named_and_left_so(tmp_path):
    result = ctl("nodes", data_dir=tmp_path / "new")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(
        f"error: no llmgw database in {tmp_path / 'new'} (LLMGW_DATA_DIR): start a server on it first "
        "(llmgw demo, or llmgw migrate), or point ctl elsewhere\n  start the demo: make demo"
    )
    assert not (tmp_path / "new").exists()


def test_a_database_without_tables_asks_for_migrate(tmp_path):
    (tmp_path / "llmgw.sqlite3").write_bytes(b"")
    result = ctl("nodes", data_dir=tmp_path)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        f"error: the database {tmp_path / 'llmgw.sqlite3'} has no llmgw tables yet "
        "(no such table: facility_hold): run `llmgw migrate` first\n"
    )


def test_a_sqlite_database_that_is_not_there_is_named_and_not_made(tmp_path):
    for path in (tmp_path / "x.db", tmp_path / "a-file" / "llmgw.sqlite3"):
        (tmp_path / "a-file").write_text("not a directory")
        result = ctl("models", database_url=f"sqlite:///{path}")
        assert (result.returncode, result.stdout) == (1, "")
        assert result.stderr == (
            f"error: no database at {path} (DATABASE_URL): start a server on it first (llmgw migrate), or point "
            "ctl elsewhere\n"
        )
        assert not path.exists()  # SQLite would have made an empty file there


@pytest.mark.postgres
@pytest.mark.slow
def test_an_empty_postgresql_database_asks_for_migrate():
    import psycopg

    base = urlparse(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/llmgw"))
    if not base.scheme.startswith("postgres"):
        pytest.skip("needs DATABASE_URL on PostgreSQL")
    name = f"llmgw_empty_{uuid.uuid4().hex[:8]}"
    admin = urlunparse(base._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        result = ctl("label", "gpu01", "team=a", database_url=urlunparse(base._replace(path=f"/{name}")))
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {name} WITH (FORCE)")
    assert result.returncode == 1
    assert result.stderr.startswith(f"error: the database {base.hostname}:{base.port or 5432}/{name} has no llmgw tables yet (")
    assert result.stderr.endswith("does not exist): run `llmgw migrate` first\n")


def test_a_postgresql_server_that_is_not_there_is_named_at_once():
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = ctl("models", database_url=f"postgres://postgres@127.0.0.1:{port}/llmgw")
    assert result.returncode == 1
    assert result.stderr.startswith(f"error: cannot open the database 127.0.0.1:{port}/llmgw (DATABASE_URL): ")
    assert "Connection refused" in result.stderr
    assert "Traceback" not in result.stderr
