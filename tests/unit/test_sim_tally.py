"""`llmgw sim up` says at its end what the control plane answered: every heartbeat counted by status, a refusal
each time (its log names only the first of a streak)."""

from __future__ import annotations

from collections import Counter

from agents.simulator.client import tally_text


def test_the_tally_counts_refusals_by_status_most_first():
    tally = Counter({"200": 1188, "503": 9, "ReadTimeout": 3})
    assert tally_text(tally) == "1,200 heartbeats: 1,188 ok; refused or failed: 12 (503 × 9, ReadTimeout × 3)"


def test_a_run_with_no_refusal_says_only_how_many_went_through():
    assert tally_text(Counter({"200": 40})) == "40 heartbeats: 40 ok"
    assert tally_text(Counter()) == "0 heartbeats: 0 ok"
