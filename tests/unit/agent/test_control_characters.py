"""No text a heartbeat carries, and no label value, holds a control character — C0, DEL or C1 (U+009B
starts a terminal's escape sequence as ESC [ does) — and an agent never sends one in a replica's message."""

from __future__ import annotations

import pytest

from agents.node.protocol import MAX_MESSAGE_LENGTH, HeartbeatError, message_text, validate_heartbeat
from facility.domains import DomainError, validate_label


@pytest.mark.parametrize("character", ["\x1b", "\x7f", "\x85", "\x9b"])
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"agent_version": "1.0{c}"}, "agent_version"),
        ({"labels": {"team": "search{c}"}}, "labels.team"),
    ],
)
def test_a_heartbeat_text_with_a_control_character_is_refused_naming_its_field(character, body, field):
    def filled(value):
        if isinstance(value, dict):
            return {k: filled(v) for k, v in value.items()}
        return value.replace("{c}", character)

    with pytest.raises(HeartbeatError) as excinfo:
        validate_heartbeat({"node": "gpu01", **filled(body)})
    assert excinfo.value.field == field
    assert "control character" in str(excinfo.value)


def test_a_label_value_with_a_c1_control_is_refused():
    with pytest.raises(DomainError, match="control character"):
        validate_label("team", "search\x9b2J")


def test_an_agents_replica_message_escapes_what_a_heartbeat_may_not_carry():
    message = message_text("cannot start: OSError: bad name 'x\x9b2J\x00' \ud800\tand\nmore")
    assert message == "cannot start: OSError: bad name 'x\\x9b2J\\x00' \\ud800\tand\nmore"
    body = {"node": "gpu01", "replicas": [{"id": 1, "state": "failed", "message": message}]}
    assert validate_heartbeat(body)["replicas"][0]["message"] == message
    assert len(message_text("\x9b" * 5000)) == MAX_MESSAGE_LENGTH
