"""`llmgw ctl … --help` names what a person sets and what a figure counts."""

import pytest

from llmgw.ctl import main as ctl


def help_of(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as done:
        ctl([*argv, "--help"])
    assert done.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_the_measured_window_is_named_as_server_yaml_and_the_environment_set_it(capsys):
    text = help_of(capsys, "facility")
    assert ("the measured window (server.yaml's facility.measured_window, else LLMGW_MEASURED_WINDOW_SECONDS; "
            "15 minutes by default)") in text
    assert ("RESERVED is the draw placed there; MEASURED PEAK what its nodes read, each without node_watts or "
            "other_watts (so they may sum to less than USE). A domain past its limit is named under the table.") in text


def test_feed_loss_says_its_load_is_the_use_ctl_facility_shows(capsys):
    assert ("A load is the use `llmgw ctl facility` shows (node by node, node_watts plus the larger of placed and "
            "the measured peak); reserved and the measured peak are shown beside it. A PDU's or feed's load is what it would "
            "carry: a node on PDUs left splits over them, and so do a rack's other_watts. Exits 3 when it finds a "
            "violation (0: none; 1: an error), so a timer or a check can tell.") in help_of(capsys, "facility", "feed-loss")
    assert "RESERVED and MEASURED PEAK beside it (each with node_watts, unlike `llmgw ctl facility`'s)" in help_of(
        capsys, "facility", "feeds"
    )


def test_listings_and_labels_say_what_they_hold(capsys):
    assert "leg (the three-phase legs drawn from, PDU.A, comma separated)" in help_of(capsys, "label", "gpu01", "a=b")
    assert "MIN (min_ready: what llmgw's own drains, shedding and capping keep ready)" in help_of(capsys, "models")
    assert "REASON (why it waits, or why it is being replaced)" in help_of(capsys, "replicas")
    assert "Nothing is written." in help_of(capsys, "headroom", "m")
    assert "--cap-watts CAP_WATTS the cap in watts (18400, not 18.4kW)" in help_of(
        capsys, "facility", "budget", "set", "rack:r1"
    )


def ctl_commands(parser, path=()):
    """Every ctl command's words, subcommands included (`facility what-if hold`)."""
    import argparse

    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, below in action.choices.items():
                yield from ctl_commands(below, (*path, name))


def test_every_command_shows_its_help_whatever_words_come_before(capsys):
    from llmgw.ctl import build_parser

    commands = [*ctl_commands(build_parser()), ("node", "token"), ("node", "show"), ("node", "token", "gpu01")]
    for words in commands:
        with pytest.raises(SystemExit) as done:
            ctl([*words, "--help"])
        out = capsys.readouterr()
        assert (done.value.code, out.err) == (0, ""), words
        assert out.out.startswith("usage: llmgw ctl"), words


def test_a_node_command_without_its_node_is_refused_with_the_usage(capsys):
    with pytest.raises(SystemExit) as done:
        ctl(["node", "token"])
    assert done.value.code == 2
    assert capsys.readouterr().err.endswith(
        "llmgw ctl node: error: give a node: llmgw ctl node NODE, or llmgw ctl node token NODE\n"
    )
