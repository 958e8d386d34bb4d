"""Fixture trees of real machines (tests/fixtures/sys/<name>) and a clock tests move by hand."""

from __future__ import annotations

import shutil
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sys"


def tree(name: str) -> str:
    """The path of a fixture tree (xeon, epyc, vm): a root holding sys/ and proc/. Read-only."""
    return str(FIXTURES / name)


def copy_tree(name: str, destination: Path) -> Path:
    """Copy a fixture tree under destination so a test can change its files; returns the copy."""
    target = destination / name
    shutil.copytree(FIXTURES / name, target, symlinks=True)
    return target


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
