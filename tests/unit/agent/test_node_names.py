"""One rule for a node's name: agent.yaml, the heartbeat and the control plane's services all use it."""

from __future__ import annotations

import pytest

from agents.node.config import AgentConfigError, parse_config
from agents.node.protocol import HeartbeatError, is_node_name, validate_heartbeat

GOOD = ["gpu01", "g", "rack-12.gpu_01", "a" * 253]
BAD = ["gpu01-", "-gpu01", "gpu01.", "gpu 01", "gpu01\n", "", "a" * 254, None, 12]


@pytest.mark.parametrize("name", GOOD)
def test_good_names_pass_everywhere(name):
    assert is_node_name(name)
    assert parse_config(f"server: http://cp\nnode: {name}\ntoken: t\n").node == name
    assert validate_heartbeat({"node": name})["node"] == name


@pytest.mark.parametrize("name", BAD)
def test_bad_names_are_refused(name):
    assert not is_node_name(name)
    with pytest.raises(HeartbeatError) as excinfo:
        validate_heartbeat({"node": name or "x\n"})
    assert excinfo.value.field == "node"


def test_agent_yaml_refuses_a_trailing_dash_as_ctl_does():
    with pytest.raises(AgentConfigError) as excinfo:
        parse_config("server: http://cp\nnode: gpu01-\ntoken: t\n")
    assert str(excinfo.value).startswith("agent.yaml line 2: node: 'gpu01-' is not a node name (")


def test_the_services_use_the_same_rule():
    from agents.services import clean_node_name
    from llmgw.errors import InvalidInput

    assert clean_node_name("gpu01") == "gpu01"
    with pytest.raises(InvalidInput) as excinfo:
        clean_node_name("gpu01-")
    assert excinfo.value.message.startswith("node: 'gpu01-' is not a node name (")
