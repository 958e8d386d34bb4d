"""The simulated nodes' tokens, kept in a file beside the data they post to (the demo's data directory).

A token made for a simulated node — `llmgw ctl node token gpu01` on the demo, from any process, here or
through the API — replaces the node's old one at once: the simulator, holding the old one, would be
refused from then on. So the demo keeps its simulated nodes' tokens in this file (mode 0600, as the
data directory's secret key), a new token of a node it names is written there too, and the simulator
reads the file again whenever it changed: the node keeps heartbeating with the token just printed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

FILE_NAME = "sim-tokens.json"


def tokens_path(data_dir: Path) -> Path:
    return Path(data_dir) / FILE_NAME


def tokens_write(path: Path, tokens: Mapping[str, str]) -> None:
    """The file holds exactly ``tokens``: written whole to a file of this process's own (0600 from its
    start), then moved in place, so a reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mine = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(mine, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(dict(tokens), handle, indent=1, sort_keys=True)
    os.replace(mine, path)


def tokens_read(path: Path) -> dict[str, str]:
    """The file's tokens; none when there is no file or it is not one this module wrote."""
    try:
        tokens = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(tokens, dict):
        return {}
    return {str(name): str(key) for name, key in tokens.items()}


def token_hand_over(path: Path, *, node_name: str, key: str) -> bool:
    """Give a simulated node its new token: True when the file names the node (a node the simulator runs),
    False, and nothing written, for any other node."""
    tokens = tokens_read(path)
    if node_name not in tokens:
        return False
    tokens[node_name] = key
    tokens_write(path, tokens)
    return True


class KeptTokens(Mapping[str, str]):
    """The file's tokens by node name, read again when the file changed since the last look (a stat per
    lookup: a heartbeat's worth of work is far larger)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._seen: tuple[int, int, int] | None = None
        self._tokens: dict[str, str] = {}

    def _fresh(self) -> dict[str, str]:
        try:
            stat = self.path.stat()
            seen = (stat.st_ino, stat.st_mtime_ns, stat.st_size)  # each write is a new file: a new inode
        except OSError:
            return self._tokens  # gone for a moment: the tokens last read still stand
        if seen != self._seen:
            tokens = tokens_read(self.path)
            if tokens:
                self._tokens, self._seen = tokens, seen
        return self._tokens

    def __getitem__(self, name: str) -> str:
        return self._fresh()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fresh())

    def __len__(self) -> int:
        return len(self._fresh())
