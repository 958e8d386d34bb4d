"""Where `llmgw ctl` finds the control plane's data when nothing says where it is.

`llmgw demo` records its data directory in ``$XDG_STATE_HOME/llmgw/demo.json`` (default
``~/.local/state/llmgw/demo.json``). Local ctl, without LLMGW_URL, --server, LLMGW_DATA_DIR and
DATABASE_URL, works on ``./var`` when it holds a database, else on the data the last demo recorded; it
never creates a database where it looked (an empty SQLite file and a `./var` left wherever it ran), and
with none found it says what to do and exits 2.

This module imports no Django: it runs before the settings are read.
"""

from __future__ import annotations

import json
import os
from collections.abc import MutableMapping
from pathlib import Path

DATABASE_FILE = "llmgw.sqlite3"  # as llmgw.settings names it under LLMGW_DATA_DIR

WHAT_TO_DO = (
    "  start the demo: make demo, in the llmgw checkout (llmgw ctl then finds it from any directory)\n"
    "  or use a running server: export LLMGW_URL=http://HOST:8000, then llmgw ctl login (a token from\n"
    "    llmgw ctl token create USER --role operator, run where its database is)\n"
    "  or its data: export LLMGW_DATA_DIR=DIR (the server's data directory) or DATABASE_URL=postgres://…"
)


class ServerNotFound(Exception):
    """No control plane for local ctl to work on; the message says what to do (ctl exits 2)."""


def state_dir() -> Path:
    """$XDG_STATE_HOME/llmgw, else ~/.local/state/llmgw."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "llmgw"


def demo_record_path() -> Path:
    return state_dir() / "demo.json"


def demo_record_write(*, data_dir: Path, url: str | None) -> Path:
    """Say where the demo's data is (and where it serves, when it does), for ctl run from anywhere."""
    path = demo_record_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    mine = path.with_name(f".{path.name}.{os.getpid()}")
    mine.write_text(json.dumps({"data_dir": str(Path(data_dir).resolve()), "url": url}, indent=1) + "\n")
    os.replace(mine, path)
    return path


def demo_record_read() -> dict | None:
    """The last demo's record, or None when there is none (or it is not one demo_record_write wrote)."""
    try:
        record = json.loads(demo_record_path().read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("data_dir"), str):
        return None
    return record


def shown(path: Path) -> str:
    """A path as a person typed it: ~ for the home directory."""
    home = str(Path.home())
    text = str(path)
    return "~" + text[len(home):] if home != "/" and (text == home or text.startswith(home + "/")) else text


def local_data_find(environ: MutableMapping[str, str] = os.environ) -> None:
    """Set LLMGW_DATA_DIR in ``environ`` to the data local ctl works on, or raise ServerNotFound.

    DATABASE_URL names the database itself: nothing to find. A data directory given (LLMGW_DATA_DIR)
    must hold a database already; not given, ./var does when it holds one, else the last demo's.
    """
    if environ.get("DATABASE_URL"):
        return
    given = environ.get("LLMGW_DATA_DIR")
    if given:
        data_dir = Path(given).resolve()
        if not (data_dir / DATABASE_FILE).is_file():
            raise ServerNotFound(
                f"no llmgw database in {data_dir} (LLMGW_DATA_DIR): start a server on it first "
                f"(llmgw demo, or llmgw migrate), or point ctl elsewhere\n{WHAT_TO_DO}"
            )
        return
    here = Path("var").resolve()
    if (here / DATABASE_FILE).is_file():
        environ["LLMGW_DATA_DIR"] = str(here)
        return
    record = demo_record_read()
    if record is None:
        raise ServerNotFound(
            "no llmgw server found: LLMGW_URL and LLMGW_DATA_DIR are not set, ./var here holds no llmgw "
            f"database, and no demo has run as this user ({shown(demo_record_path())})\n{WHAT_TO_DO}"
        )
    data_dir = Path(record["data_dir"])
    if not (data_dir / DATABASE_FILE).is_file():
        raise ServerNotFound(
            f"the demo's data is gone: {shown(demo_record_path())} names {data_dir}, which holds no "
            f"database now\n{WHAT_TO_DO}"
        )
    environ["LLMGW_DATA_DIR"] = str(data_dir)


# -- the demo running on a data directory ------------------------------------------------------------------

DEMO_LOCK_FILE = "demo.lock"  # in the data directory: the running demo's pid and address, locked while it runs


class DemoRunning(Exception):
    """A demo already runs on this data directory; the message names it (address, pid) and what to do."""


def demo_lock_take(data_dir: Path, *, url: str | None):
    """Lock ``data_dir`` for this demo for as long as the process lives (the open file returned holds the
    lock; the system lets it go when the process ends, however it ends), recording its pid and address.
    Raises DemoRunning naming the demo that holds it: two demos on one data would reset each other's
    admin password, repoint demo.json and beat for the same nodes."""
    import fcntl

    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    handle = open(data_dir / DEMO_LOCK_FILE, "a+")  # noqa: SIM115 - held open: the lock lives as long as it
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        running = _lock_record(handle)
        handle.close()
        where = running.get("url") or "loading its data (--no-serve)"
        raise DemoRunning(
            f"a demo already runs on {data_dir}: {where}, pid {running.get('pid', '?')}. Stop it (Ctrl-C where "
            "it runs), use it, or start this one on another data directory: "
            "LLMGW_DATA_DIR=DIR llmgw demo (make demo LLMGW_DATA_DIR=DIR ADDR=…)"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps({"pid": os.getpid(), "url": url}) + "\n")
    handle.flush()
    return handle


def demo_lock_state(data_dir: Path) -> tuple[bool, dict]:
    """(whether a demo runs on ``data_dir`` now, the record the last one left: pid and url); (False, {})
    where no demo has run there."""
    import fcntl

    try:
        handle = open(Path(data_dir) / DEMO_LOCK_FILE)  # noqa: SIM115
    except OSError:
        return False, {}
    with handle:
        record = _lock_record(handle)
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True, record
        return False, record


def _lock_record(handle) -> dict:
    handle.seek(0)
    try:
        record = json.loads(handle.read(1000) or "{}")
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def demo_stopped_note(data_dir: Path) -> str | None:
    """What local ctl says when the data it works on is a demo's that served and runs no more: its nodes
    show as they were when it stopped (ready until their heartbeats are missed), nothing answers them."""
    running, record = demo_lock_state(data_dir)
    if running or not record.get("url"):
        return None
    return (
        f"note: the demo on this data ({shown(Path(data_dir))}) is not running: {record['url']} does not answer, "
        "and nodes show as they were when it stopped; start it again with make demo"
    )
