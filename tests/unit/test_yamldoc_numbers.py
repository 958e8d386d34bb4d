"""Numbers in the YAML files people write read as YAML 1.2 reads them, not as 1.1: no base-60 times, no
octal from a leading zero, an exponent without a dot is a number."""

from __future__ import annotations

import math

import pytest

from llmgw.errors import InvalidInput
from llmgw.yamldoc import load_documents
from placement.documents import models_parse


def value(text: str):
    return load_documents(f"a: {text}\n", "f.yaml")[0].data["a"]


@pytest.mark.parametrize(
    ("text", "read"),
    [
        ("1:30", "1:30"),  # 1.1: 90
        ("010", 10),  # 1.1: 8
        ("0o10", 8),
        ("0x8", 8),
        ("1e12", 1e12),  # 1.1: text
        ("1.5e+3", 1500.0),
        ("10_000", 10000),
        ("-3", -3),
        (".5", 0.5),
        ("0b101", "0b101"),  # 1.1: 5
        ("0o", "0o"),
        ("0x_", "0x_"),
        ("'010'", "010"),
        ("yes", True),  # booleans stay as people write them in config files
    ],
)
def test_a_scalar_reads_as_yaml_1_2(text, read):
    assert value(text) == read
    assert type(value(text)) is type(read)


def test_infinities_and_nan_read_as_floats():
    assert value("-.inf") == -math.inf
    assert math.isnan(value(".nan"))


def test_a_time_like_replicas_count_is_refused_not_read_as_ninety():
    with pytest.raises(InvalidInput, match="replicas") as refused:
        models_parse(text="kind: Model\nname: m\nreplicas: 1:30\nprofile: {gpus: 1}\n")
    assert "1:30" in str(refused.value)


def test_a_hex_integer_is_bounded_as_a_decimal_one():
    with pytest.raises(InvalidInput, match="an integer of more than 30 digits"):
        value("0x" + "F" * 5000)
