"""Schemathesis, with every check, against a live server: the schema and the answers agree, and no input
makes a 5xx. Bounded (a few dozen examples per operation, fixed seed) so it runs in each `make test`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import node_spec

SCHEMATHESIS = str(Path(sys.executable).with_name("schemathesis"))
CONFIG = str(Path(__file__).with_name("schemathesis.toml"))
HOOKS = str(Path(__file__).with_name("schemathesis_hooks.py"))  # one ast.parse at a time: see its docstring
MAX_EXAMPLES = "15"


@pytest.fixture
def seeded(transactional_db):
    """Something of everything, placed, so lists and details answer with bodies the schema must describe.
    Its nodes are due again in an hour, not in 30 s: what a test reads of them (ready, placed) does not change
    while it runs, however long a loaded machine makes it (a listing read here and in a fresh process)."""
    from agents.models import Node
    from agents.services import heartbeat_record
    from agents.simulator.cluster import heartbeat_for
    from facility.services import budget_set, hold_create
    from placement.services import model_apply

    heartbeat_record(node_name="gpu01", heartbeat=heartbeat_for(node_spec("gpu01", rack="r1-01", pdu="p1")))
    heartbeat_record(node_name="gpu02", heartbeat=heartbeat_for(node_spec("gpu02", rack="r1-02", pdu="p2")))
    Node.objects.update(heartbeat_interval_seconds=3600)
    budget_set(domain="rack:r1-01", cap_watts=40_000)
    hold_create(domain="rack:r1-02", reason="maintenance", drain=True)
    model_apply(data={"kind": "Model", "name": "llama", "replicas": 2, "profile": {"gpus": 4}})


def fuzz(url: str, token: str, name: str, *only: str) -> None:
    report = Path("test-output") / f"schemathesis-{name}.txt"  # the whole run, to read after a failure
    report.parent.mkdir(exist_ok=True)
    result = subprocess.run(
        [
            SCHEMATHESIS, "--config-file", CONFIG, "run", f"{url}/api/v1/schema", "--url", url,
            "-H", f"Authorization: Token {token}",
            "--checks", "all", "--max-examples", MAX_EXAMPLES, "--seed", "1", "--workers", "2",
            "--no-color", "--warnings", "off",
            # The heartbeat takes a node token (this run's tokens answer 401 there); its body checks are
            # the heartbeat lane's own (agents/node/protocol.py), tested in test_heartbeat_api, not fuzzed here.
            "--exclude-operation-id", "agents_heartbeat_create",
            *[arg for operation in only for arg in ("--include-operation-id", operation)],
        ],
        # A bound against a hang, not a measure of speed: a busy 2-core machine takes minutes.
        capture_output=True, text=True, timeout=1200, env={**os.environ, "SCHEMATHESIS_HOOKS": HOOKS},
    )
    report.write_text(result.stdout + result.stderr)
    assert result.returncode == 0, f"schemathesis ({name}) found failures:\n{result.stdout[-12000:]}{result.stderr[-2000:]}"


@pytest.mark.postgres
@pytest.mark.timeout(1500)
def test_the_schema_holds_for_an_operator(live_server, seeded, celery_on_redis, make_user):
    # From here reconciles go to a Redis queue no worker reads: a fuzzed `replicas: 10000` is checked and
    # stored, not placed inside the request (placing is the worker's, not what this test is about).
    _, key = make_user("fuzz-operator", "operator")
    fuzz(live_server.url, key, "operator")


@pytest.mark.postgres
@pytest.mark.timeout(1500)
def test_the_schema_holds_for_a_viewer(live_server, seeded, celery_on_redis, make_user):
    _, key = make_user("fuzz-viewer", "viewer")
    fuzz(live_server.url, key, "viewer")


@pytest.mark.postgres
@pytest.mark.timeout(1500)
def test_the_token_endpoints_hold_for_an_admin(live_server, seeded, make_user):
    # The operator's and viewer's runs meet only 403 there: an admin's makes users, roles and node tokens.
    admin, key = make_user("fuzz-admin", "operator")
    admin.is_staff = True
    admin.save()
    fuzz(live_server.url, key, "admin", "tokens_create", "nodes_token_create")
