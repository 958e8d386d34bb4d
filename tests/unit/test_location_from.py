"""facility.location_from (facility.domains): whose word each location level is, and what effective
labels and conflicts follow from it."""

from __future__ import annotations

import pytest

from facility.configuration import ConfigError
from facility.domains import (
    LEVELS,
    LOCATION_KEYS,
    agent_location_keys,
    domains_of,
    effective_labels,
    location_conflicts,
    parse_location_from,
)

AGENT = {"llmgw.io/site": "sto1", "llmgw.io/rack": "r9", "llmgw.io/pdu": "r9-a", "gpu": "h100"}
STORE = {"llmgw.io/rack": "r1"}


@pytest.mark.parametrize(
    ("raw", "store_levels"),
    [
        (None, []),
        ("agents", []),
        ("store", list(LEVELS)),
        ({}, []),
        ({"rack": "store", "pdu": "store"}, ["rack", "pdu"]),
        ({"rack": "store", "site": "agents"}, ["rack"]),
    ],
)
def test_location_from_reads_as_a_source_per_level(raw, store_levels):
    parsed = parse_location_from(raw)
    assert parsed == {level: "store" if level in store_levels else "agents" for level in LEVELS}


@pytest.mark.parametrize(
    ("raw", "path", "message"),
    [
        ("shop", (), "agents, store, or a mapping of level to agents or store; not 'shop'"),
        (["rack"], (), "agents, store, or a mapping of level to agents or store; not ['rack']"),
        ({"rak": "store"}, ("rak",), "unknown level; levels are site, room, row, rack, pdu, leg"),
        ({"rack": "shop"}, ("rack",), "agents or store, not 'shop'"),
        ({"rack": True}, ("rack",), "agents or store, not True"),
    ],
)
def test_a_bad_location_from_names_its_path(raw, path, message):
    with pytest.raises(ConfigError) as exc:
        parse_location_from(raw)
    assert (exc.value.path, exc.value.message) == (path, message)


def test_by_default_the_agent_says_where_its_node_is_unless_the_store_does():
    assert effective_labels(AGENT, STORE) == {**AGENT, "llmgw.io/rack": "r1"}
    assert effective_labels(AGENT, {}) == AGENT
    assert location_conflicts(AGENT, STORE) == []


def test_a_level_from_the_store_takes_nothing_of_the_agents():
    trusted = agent_location_keys(parse_location_from({"rack": "store", "pdu": "store"}))
    assert trusted == set(LOCATION_KEYS) - {"llmgw.io/rack", "llmgw.io/pdu"}
    labels = effective_labels(AGENT, STORE, trusted)
    assert labels == {"llmgw.io/site": "sto1", "llmgw.io/rack": "r1", "gpu": "h100"}
    assert [str(d) for d in domains_of(labels)] == ["site:sto1", "rack:r1"]
    assert location_conflicts(AGENT, STORE, trusted) == [
        "llmgw.io/rack: the agent says r9, the store says r1; the agent's value is ignored (location_from: rack: store)",
        "llmgw.io/pdu: the agent says r9-a, the store has no pdu; the agent's value is ignored "
        "(location_from: pdu: store)",
    ]


def test_an_agent_that_agrees_with_the_store_is_no_conflict():
    trusted = agent_location_keys(parse_location_from("store"))
    assert location_conflicts({"llmgw.io/rack": "r1", "gpu": "h100"}, STORE, trusted) == []
    assert effective_labels({"gpu": "h100"}, {}, trusted) == {"gpu": "h100"}  # free labels stay the agent's
