"""Runs bench/auditor.sql: installs its commit log (setup) and reads its violations (checks).

Plain psycopg and the SQL file; nothing of llmgw's code, so what it finds is found independently.
"""

from __future__ import annotations

from pathlib import Path

SQL = Path(__file__).with_name("auditor.sql")


def _part(name: str) -> str:
    text = SQL.read_text()
    start = text.index(f"-- @@ {name}")
    end = text.find("-- @@ ", start + 1)
    return text[start : end if end >= 0 else None]


def install(url: str, *, fresh_seconds: float) -> None:
    """The log table and the deferred trigger that writes each placing commit's post-state into it."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_part("SETUP"))
        conn.execute("DELETE FROM audit_settings")
        conn.execute("INSERT INTO audit_settings VALUES (%s)", (fresh_seconds,))


def violations(url: str) -> list[tuple[str, str]]:
    """Every violation the checks find: (kind, detail)."""
    import psycopg

    with psycopg.connect(url) as conn:
        return [tuple(row) for row in conn.execute(_part("CHECKS")).fetchall()]


def logged_commits(url: str) -> int:
    """How many domain post-states the log holds (what the limit check read)."""
    import psycopg

    with psycopg.connect(url) as conn:
        return conn.execute("SELECT COUNT(*) FROM audit_commit").fetchone()[0]
