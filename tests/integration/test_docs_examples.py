"""The docs' examples that run on the demo do: every block of docs/*.md marked `<!-- runs on the demo -->`
runs, command by command and in order, on a demo of its own (embedded SQLite, no server), and prints what
the block shows.

A marked block is a session: `$ llmgw …` lines (a `  # comment` after one is not typed), each followed
by what it prints. The lines shown must be printed as shown and in order, one after the other; a line
`…` stands for lines left out (at the top, the bottom or between), a line ending in ` …` for the rest of
that line, one starting with `… ` for its start (a time). A command whose shown output starts with `error: ` must fail, saying it.

The blocks left unmarked, and why: the command lists with placeholders (`[--drain]`, `a | b`), which are
references rather than sessions; commands that start servers or need one over HTTP (`llmgw serve`,
`worker`, `agent`, `ctl login` and remote mode: tests/integration/test_ctl_remote.py runs those); the
production and Compose sessions of deployment.md (tests/integration/test_deploy_units.py); and output
quoted from other machines (an H200 node's heartbeat).
"""

from __future__ import annotations

import os
import re
import shlex
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARK = "<!-- runs on the demo -->"
BLOCK = re.compile(re.escape(MARK) + r"\n```[a-z]*\n(.*?)```", flags=re.S)


def doc_sessions(text: str) -> list[tuple[str, list[str]]]:
    """The marked blocks' commands in order, each with the lines it is shown printing."""
    sessions: list[tuple[str, list[str]]] = []
    for block in BLOCK.findall(text):
        for line in block.splitlines():
            if line.startswith("$ "):
                command = line[2:].split("  #", 1)[0].strip()
                assert command.startswith("llmgw "), f"a marked block runs llmgw commands only: {line}"
                sessions.append((command, []))
            else:
                assert sessions, f"a marked block starts with a command: {line}"
                sessions[-1][1].append(line.rstrip())
    return sessions


def line_matches(shown: str, printed: str) -> bool:
    if shown.endswith(" …"):
        return printed.startswith(shown[:-2])
    if shown.startswith("… "):
        return printed.rstrip().endswith(shown[2:])
    return printed.rstrip() == shown


def shown_is_printed(shown: list[str], printed: list[str]) -> bool:
    """Each run of shown lines between `…` is printed one after the other, the runs in order; the first
    from the top and the last to the bottom unless a `…` leaves lines out there."""
    runs: list[list[str]] = [[]]
    for line in shown:
        if line == "…":
            runs.append([])
        else:
            runs[-1].append(line)
    at = 0
    for i, run in enumerate(runs):
        if not run:
            continue
        first, last = i == 0, i == len(runs) - 1
        starts = [at] if first else range(at, len(printed) - len(run) + 1)
        found = next(
            (s for s in starts if s + len(run) <= len(printed)
             and all(line_matches(a, b) for a, b in zip(run, printed[s:s + len(run)], strict=True))
             and (not last or s + len(run) == len(printed))),
            None,
        )
        if found is None:
            return False
        at = found + len(run)
    return True


def test_shown_output_is_matched_run_by_run():
    printed = ["HEAD", "a", "b", "c", "TAIL"]
    assert shown_is_printed(["HEAD", "…", "b", "…"], printed)
    assert shown_is_printed(["…", "c", "TAIL"], printed)
    assert shown_is_printed(["HE …", "…"], printed)
    assert shown_is_printed(["…", "… IL"], printed) and not shown_is_printed(["…", "… HE"], printed)
    assert not shown_is_printed(["HEAD", "b", "…"], printed)  # not one after the other
    assert not shown_is_printed(["…", "b"], printed)  # b is not the last line
    assert not shown_is_printed(["c", "…", "a"], printed)


def heartbeats_fresh(data_dir: Path) -> None:
    """The demo's nodes heard from now, as its simulated agents keep them while it serves: a demo loaded
    without them (--no-serve, so the figures shown hold still) would otherwise show its nodes and their
    replicas unreachable half a minute after it loaded. Each heard from now and due again in an hour: a
    command that takes longer than three heartbeats' intervals on a loaded machine (a reconcile, a drain)
    still finds them ready at its end."""
    now = datetime.now(UTC).replace(tzinfo=None).isoformat(sep=" ")
    with sqlite3.connect(data_dir / "llmgw.sqlite3") as db:
        db.execute("UPDATE agents_node SET last_heartbeat_at = ?, heartbeat_interval_seconds = 3600", (now,))
    db.close()


def run(data_dir: Path, argv: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in {"DATABASE_URL", "REDIS_URL", "LLMGW_CONFIG", "LLMGW_URL", "LLMGW_TOKEN"}}
    env.update(LLMGW_DATA_DIR=str(data_dir), COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "llmgw.cli", *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )


DOCS = sorted(p.name for p in (ROOT / "docs").glob("*.md") if MARK in p.read_text())


def test_some_docs_have_examples_that_run():
    assert {"cli.md", "configuration.md"} <= set(DOCS)


@pytest.mark.parametrize("doc", DOCS)
def test_the_docs_examples_run_on_the_demo(doc, tmp_path):
    sessions = doc_sessions((ROOT / "docs" / doc).read_text())
    assert sessions, doc
    loaded = run(tmp_path, ["demo", "--no-serve"])
    assert loaded.returncode == 0, loaded.stderr
    for command, shown in sessions:
        heartbeats_fresh(tmp_path)
        done = run(tmp_path, shlex.split(command)[1:])
        assert "Traceback" not in done.stderr, f"{command}\n{done.stderr}"
        refused = bool(shown) and shown[0].startswith("error: ")
        assert (done.returncode != 0) == refused, f"{command}\n{done.stdout}\n{done.stderr}"
        printed = (done.stderr if refused else done.stdout).splitlines()
        assert shown_is_printed(shown, printed), f"{doc}: {command}\nshown:\n" + "\n".join(shown) + \
            "\nprinted:\n" + "\n".join(printed)
