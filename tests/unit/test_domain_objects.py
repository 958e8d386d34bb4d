"""A place's Domain: equal and hashed alike however it was made — from labels, from text, or sent from
another process (whose string hashes differ) — so the maps keyed by domains find it."""

from __future__ import annotations

import pickle
import subprocess
import sys

from facility.domains import Domain, domains_of, nearest_names, parse_domain


def test_a_domain_from_labels_from_text_and_unpickled_is_one_key():
    from_labels = domains_of({"llmgw.io/rack": "r1-01"})[0]
    counts = {from_labels: 1}
    assert counts[parse_domain("rack:r1-01")] == 1
    assert counts[Domain("rack", "r1-01")] == 1
    assert counts[pickle.loads(pickle.dumps(from_labels))] == 1


def test_a_domain_pickled_in_another_process_keys_the_same_map_here():
    # A string's hash differs between processes: the domain is made anew here, with this process's hash.
    code = "import pickle, sys; from facility.domains import parse_domain; sys.stdout.buffer.write(pickle.dumps(parse_domain('pdu:r1-01-a')))"
    sent = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True,
                          env={"PYTHONHASHSEED": "random", "PATH": ""}, cwd=".").stdout
    assert {parse_domain("pdu:r1-01-a"): "here"}[pickle.loads(sent)] == "here"


def test_nearest_names_put_a_swap_first_then_the_closest_and_leave_out_what_is_far():
    known = ["r1-02", "r1-03", "r12-10", "hall-b", "r1-01"]
    # r1-01 for r1-10 is a swap of two characters: first, though r12-10 is closer by difflib's ratio.
    assert nearest_names("r1-10", known, count=2) == ["r1-01", "r12-10"]
    assert nearest_names("r1-10", ["r1-02", "r1-01", "r2-99"], count=3) == ["r1-01", "r1-02"]
    # Ties by name; far names (under difflib's 0.6) are never offered.
    assert nearest_names("r1-0", ["r1-03", "r1-02", "zz-zz"], count=3) == ["r1-02", "r1-03"]
    assert nearest_names("hall-q", known, count=3) == ["hall-b"]
    assert nearest_names("x", known, count=3) == []
    # A name listed twice is offered once.
    assert nearest_names("r1-1", ["r1-01", "r1-01"], count=3) == ["r1-01"]
