"""The tests never touch the checkout's var/ (the demo's data): `make` exports LLMGW_DATA_DIR=$(CURDIR)/var,
and a test minting node tokens there would overwrite the demo's and take its nodes offline."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_this_run_has_a_data_directory_of_its_own():
    from django.conf import settings

    given = os.environ.get("LLMGW_TESTS_GIVEN_DATA_DIR")  # what the run below was started with
    for path in (Path(settings.DATA_DIR), Path(os.environ["LLMGW_DATA_DIR"])):
        assert path.resolve() != (REPO / "var").resolve()
        if given:
            assert path.resolve() != Path(given).resolve()
            print(f"data dir: {path}")


@pytest.mark.slow
def test_a_run_given_the_demo_data_directory_works_elsewhere(tmp_path):
    demo = tmp_path / "var"
    demo.mkdir()
    (demo / "node-tokens.json").write_text("{}")
    env = dict(os.environ, LLMGW_DATA_DIR=str(demo), LLMGW_TESTS_GIVEN_DATA_DIR=str(demo))
    for name in ("PYTEST_XDIST_WORKER", "DJANGO_SETTINGS_MODULE"):  # as a shell running `make test` has them
        env.pop(name, None)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-s",
         f"{__file__}::test_this_run_has_a_data_directory_of_its_own"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "data dir: " in run.stdout
    assert sorted(p.name for p in demo.iterdir()) == ["node-tokens.json"]
