"""The shipped alert rules, checked and unit-tested by Prometheus's own promtool."""

import shutil
import subprocess
from pathlib import Path

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


def _promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: apt-get install prometheus (scripts/test.sh installs it)"
    return path


def test_the_rules_are_valid_prometheus_rules():
    done = subprocess.run([_promtool(), "check", "rules", str(RULES / "alerts.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_rule_has_a_unit_test_and_they_pass():
    rules = (RULES / "alerts.yaml").read_text()
    tests = (RULES / "alerts.test.yaml").read_text()
    names = [line.split(":", 1)[1].strip() for line in rules.splitlines() if line.strip().startswith("- alert:")]
    assert names, "no alert rules found"
    untested = [name for name in names if f"alertname: {name}" not in tests]
    assert untested == [], f"alert rules without a promtool test: {untested}"
    done = subprocess.run([_promtool(), "test", "rules", str(RULES / "alerts.test.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
