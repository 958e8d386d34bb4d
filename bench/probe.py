"""The lean single-commit probe: what one guarded commit per placement allows on this PostgreSQL.

Plain psycopg on its own tables in a scratch database (``llmgw_bench_probe``, or ``--database``), no Django, no planning:
each placement locks two budget rows (rack and PDU, sorted), makes a guarded node update (a free card
left), a guarded budget update (the draw within the cap), inserts the booking, and commits. The
figure is the ceiling of placing one replica per transaction; bench/placements.py prints it beside
llmgw's own figures.

Run: ``.venv/bin/python bench/probe.py`` (``--seconds``). Prints a figure, asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import time

BENCH_DB = "llmgw_bench_probe"
RACKS = 40
NODES_PER_RACK = 25


def probe(base_url: str, seconds: float = 5.0, database: str = BENCH_DB) -> tuple[int, float]:
    """Commit guarded placements for ``seconds`` in the scratch database ``database``; (placements, wall
    seconds)."""
    import psycopg

    from bench.placements import bench_database

    url = bench_database(base_url, database)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE budget (domain text PRIMARY KEY, cap double precision, used double precision);"
            "CREATE TABLE node (id int PRIMARY KEY, rack int, pdu text, free int);"
            "CREATE TABLE booking (id bigserial PRIMARY KEY, node_id int REFERENCES node, draw double precision)"
        )
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO budget VALUES (%s, 1e12, 0)",
                [(f"rack:{r}",) for r in range(RACKS)] + [(f"pdu:{r}-{p}",) for r in range(RACKS) for p in "ab"],
            )
            cur.executemany(
                "INSERT INTO node VALUES (%s, %s, %s, 1000000)",
                [(i, i // NODES_PER_RACK, f"pdu:{i // NODES_PER_RACK}-{'ab'[i % 2]}") for i in range(RACKS * NODES_PER_RACK)],
            )
    nodes = RACKS * NODES_PER_RACK
    count = 0
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            node = count % nodes
            rack, pdu = f"rack:{node // NODES_PER_RACK}", f"pdu:{node // NODES_PER_RACK}-{'ab'[node % 2]}"
            cur.execute(
                "SELECT domain, cap, used FROM budget WHERE domain IN (%s, %s) ORDER BY domain FOR UPDATE", (rack, pdu)
            )
            cur.fetchall()
            cur.execute("UPDATE node SET free = free - 1 WHERE id = %s AND free > 0", (node,))
            assert cur.rowcount == 1
            cur.execute(
                "UPDATE budget SET used = used + 700 WHERE domain IN (%s, %s) AND used + 700 <= cap", (rack, pdu)
            )
            assert cur.rowcount == 2
            cur.execute("INSERT INTO booking (node_id, draw) VALUES (%s, 700)", (node,))
            conn.commit()
            count += 1
        wall = time.perf_counter() - started
    return count, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--database", default=BENCH_DB, help="the scratch database's name, dropped and made afresh")
    args = parser.parse_args()
    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/llmgw")
    count, wall = probe(base, args.seconds, args.database)
    print(f"lean single-commit probe: {count} commits in {wall:.2f} s, {count / wall:,.0f}/s")


if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
