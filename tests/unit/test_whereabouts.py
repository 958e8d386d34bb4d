"""Where local ctl finds the control plane's data with nothing set, and what it says when there is none."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.whereabouts import (
    ServerNotFound,
    demo_record_path,
    demo_record_read,
    demo_record_write,
    local_data_find,
)

WHAT_TO_DO = (
    "  start the demo: make demo, in the llmgw checkout (llmgw ctl then finds it from any directory)\n"
    "  or use a running server: export LLMGW_URL=http://HOST:8000, then llmgw ctl login (a token from\n"
    "    llmgw ctl token create USER --role operator, run where its database is)\n"
    "  or its data: export LLMGW_DATA_DIR=DIR (the server's data directory) or DATABASE_URL=postgres://…"
)


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A user with no demo yet, in an empty working directory."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    return tmp_path / "home"


def data_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "llmgw.sqlite3").write_bytes(b"")
    return path


def test_nothing_found_says_what_to_do_and_creates_nothing(home, tmp_path):
    environ: dict[str, str] = {}
    with pytest.raises(ServerNotFound) as caught:
        local_data_find(environ)
    assert str(caught.value) == (
        "no llmgw server found: LLMGW_URL and LLMGW_DATA_DIR are not set, ./var here holds no llmgw database, "
        f"and no demo has run as this user (~/.local/state/llmgw/demo.json)\n{WHAT_TO_DO}"
    )
    assert environ == {} and list((tmp_path / "work").iterdir()) == [] and not home.exists()


def test_the_last_demos_data_is_found_from_anywhere(home, tmp_path):
    data = data_dir(tmp_path / "checkout" / "var")
    assert demo_record_write(data_dir=data, url="http://127.0.0.1:8000") == home / ".local/state/llmgw/demo.json"
    assert demo_record_read() == {"data_dir": str(data), "url": "http://127.0.0.1:8000"}
    environ: dict[str, str] = {}
    local_data_find(environ)
    assert environ == {"LLMGW_DATA_DIR": str(data)}

    # ./var with a database is nearer than the demo's record.
    here = data_dir(tmp_path / "work" / "var")
    local_data_find(environ := {})
    assert environ == {"LLMGW_DATA_DIR": str(here)}


def test_a_demo_whose_data_is_gone_is_named(home, tmp_path):
    demo_record_write(data_dir=tmp_path / "gone", url=None)
    with pytest.raises(ServerNotFound) as caught:
        local_data_find({})
    assert str(caught.value) == (
        f"the demo's data is gone: ~/.local/state/llmgw/demo.json names {tmp_path / 'gone'}, which holds no "
        f"database now\n{WHAT_TO_DO}"
    )


def test_a_data_directory_given_must_hold_a_database(home, tmp_path):
    with pytest.raises(ServerNotFound) as caught:
        local_data_find({"LLMGW_DATA_DIR": str(tmp_path / "new")})
    assert str(caught.value) == (
        f"no llmgw database in {tmp_path / 'new'} (LLMGW_DATA_DIR): start a server on it first "
        f"(llmgw demo, or llmgw migrate), or point ctl elsewhere\n{WHAT_TO_DO}"
    )
    assert not (tmp_path / "new").exists()
    given = {"LLMGW_DATA_DIR": str(data_dir(tmp_path / "old"))}
    local_data_find(given)
    assert given == {"LLMGW_DATA_DIR": str(tmp_path / "old")}
    local_data_find(url := {"DATABASE_URL": "postgres://db/llmgw"})  # names the database itself
    assert url == {"DATABASE_URL": "postgres://db/llmgw"}


def test_the_record_follows_xdg_state_home(home, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert demo_record_path() == tmp_path / "state" / "llmgw" / "demo.json"
    (tmp_path / "state" / "llmgw").mkdir(parents=True)
    demo_record_path().write_text("not json")
    assert demo_record_read() is None
