"""deploy/systemd/agent.yaml.example passes its own dry run, from any directory, as a node's admin tries it
before installing it (`llmgw agent --once --dry-run --config …`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LLMGW = Path(sys.executable).parent / "llmgw"


def test_the_example_passes_its_dry_run(tmp_path):
    example = REPO / "deploy" / "systemd" / "agent.yaml.example"
    got = subprocess.run([str(LLMGW), "agent", "--once", "--dry-run", "--config", str(example)],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    report = json.loads(got.stdout)
    assert report["labels"] == {"llmgw.io/rack": "r12-07", "llmgw.io/pdu": "r12-07-a,r12-07-b"}
    assert report["replicas"] == []
