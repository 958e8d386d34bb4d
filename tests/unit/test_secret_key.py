"""The secret key kept in the data directory: one key for every process started together."""

from __future__ import annotations

from llmgw import settings


def test_a_key_is_made_once_and_kept(tmp_path):
    path = tmp_path / "data" / "secret_key"
    key = settings.kept_secret_key(path)
    assert len(key) >= 50
    assert settings.kept_secret_key(path) == key
    assert path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["secret_key"]


def test_a_process_that_finds_another_made_the_key_meanwhile_takes_that_one(tmp_path, monkeypatch):
    path = tmp_path / "secret_key"
    made = settings.secrets.token_urlsafe

    def another_process_first(size):
        path.write_text("the-first-process-key\n")  # it linked its key in place while this one made its own
        return made(size)

    monkeypatch.setattr(settings.secrets, "token_urlsafe", another_process_first)
    assert settings.kept_secret_key(path) == "the-first-process-key"
    assert path.read_text().strip() == "the-first-process-key"
    assert [p.name for p in tmp_path.iterdir()] == ["secret_key"]


def test_an_empty_key_file_left_behind_is_replaced(tmp_path):
    path = tmp_path / "secret_key"
    path.write_text("")
    key = settings.kept_secret_key(path)
    assert key and path.read_text() == key
