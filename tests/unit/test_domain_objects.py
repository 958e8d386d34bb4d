"""A place's Domain: equal and hashed alike however it was made — from labels, from text, or sent from
another process (whose string hashes differ) — so the maps keyed by domains find it."""

from __future__ import annotations

import pickle
import subprocess
import sys

from facility.domains import Domain, domains_of, parse_domain


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
