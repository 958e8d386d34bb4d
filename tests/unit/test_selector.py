"""node_selector: the shorthand, what each operator matches, and the errors people read."""

import pytest

from placement.selector import Expression, Selector, SelectorError, parse_selector

H100 = {"gpu.model": "H100", "gpu.memory_gib": "80", "gpu.count": "8"}


def test_parses_the_seeds_example_and_formats_it_back():
    selector = parse_selector("gpu.model in (H100, H200), gpu.memory_gib >= 80, !spot")
    assert selector.expressions == (
        Expression("gpu.model", "in", ("H100", "H200")),
        Expression("gpu.memory_gib", ">=", ("80",)),
        Expression("spot", "!exists"),
    )
    assert str(selector) == "gpu.model in (H100,H200), gpu.memory_gib >= 80, !spot"
    assert str(selector.expressions[0]) == "gpu.model in (H100,H200)"


@pytest.mark.parametrize(
    "text, formatted",
    [
        ("zone notin (a,b)", "zone notin (a,b)"),
        ("zone=a", "zone = a"),
        ("zone != a", "zone != a"),
        ("fabric.domain", "fabric.domain"),
        ("  !spot  ", "!spot"),
        ("gpu.count>4", "gpu.count > 4"),
        ("gpu.count<=8", "gpu.count <= 8"),
        ("gpu.count < 8.5", "gpu.count < 8.5"),
        ("llmgw.io/rack in (r1)", "llmgw.io/rack in (r1)"),
    ],
)
def test_each_operator_parses_and_formats(text, formatted):
    assert str(parse_selector(text)) == formatted


def test_blank_is_the_empty_selector_every_node_meets():
    selector = parse_selector("   ")
    assert selector == Selector(())
    assert selector.matches({})
    assert selector.first_unmet({}) is None


@pytest.mark.parametrize(
    "text, labels, expected",
    [
        ("gpu.model in (H100,H200)", H100, True),
        ("gpu.model in (H200)", H100, False),
        ("gpu.model in (H100)", {}, False),
        ("gpu.model notin (H100)", H100, False),
        ("gpu.model notin (A100)", H100, True),
        ("gpu.model notin (A100)", {}, True),
        ("gpu.model = H100", H100, True),
        ("gpu.model = h100", H100, False),
        ("gpu.model != H100", H100, False),
        ("gpu.model != A100", {}, True),
        ("gpu.model", H100, True),
        ("spot", H100, False),
        ("!spot", H100, True),
        ("!gpu.model", H100, False),
        ("gpu.memory_gib >= 80", H100, True),
        ("gpu.memory_gib > 80", H100, False),
        ("gpu.memory_gib < 80", H100, False),
        ("gpu.memory_gib <= 80", H100, True),
        ("gpu.memory_gib >= 80", {}, False),
        # A comparison never matches a value that is not a number.
        ("gpu.model > 1", H100, False),
        ("gpu.model < 1", H100, False),
        ("gpu.memory_gib = 80.0", H100, False),  # = compares strings
    ],
)
def test_matching(text, labels, expected):
    assert parse_selector(text).matches(labels) is expected


def test_first_unmet_names_the_first_failing_expression():
    selector = parse_selector("gpu.count >= 8, gpu.model in (H200,B200), !spot")
    unmet = selector.first_unmet(H100 | {"spot": "true"})
    assert str(unmet) == "gpu.model in (H200,B200)"
    assert selector.first_unmet({"gpu.count": "8", "gpu.model": "B200"}) is None


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "gpu.model in (H100",
            "node_selector 'gpu.model in (H100': the set is not closed with ')' at column 14",
        ),
        (
            "gpu.model in H100",
            "node_selector 'gpu.model in H100': expected '(' after 'in', found 'H' at column 14",
        ),
        (
            "gpu.count >= many",
            "node_selector 'gpu.count >= many': '>=' compares numbers, and 'many' is not one at column 11",
        ),
        (
            "gpu.count >=",
            "node_selector 'gpu.count >=': expected a value after '>=', found the end at column 13",
        ),
        ("a,,b", "node_selector 'a,,b': expected a label key, found ',' at column 3"),
        ("a,", "node_selector 'a,': expected an expression after ',' at column 3"),
        (
            "a b",
            "node_selector 'a b': expected an operator (in, notin, =, !=, >, >=, <, <=) after 'a' at column 3",
        ),
        ("9lives", "node_selector '9lives': expected a label key, found '9' at column 1"),
        ("a in (x,)", "node_selector 'a in (x,)': expected a value after ',', found ')' at column 9"),
        ("a in (x y)", "node_selector 'a in (x y)': expected ',' or ')' in the set, found 'y' at column 9"),
        ("a = x)", "node_selector 'a = x)': expected ',' between expressions, found ')' at column 6"),
    ],
)
def test_errors_name_the_problem_and_column(text, message):
    with pytest.raises(SelectorError) as caught:
        parse_selector(text)
    assert str(caught.value) == message


def test_selector_error_is_a_value_error():
    assert issubclass(SelectorError, ValueError)
    with pytest.raises(ValueError):
        parse_selector(None)  # type: ignore[arg-type]


def test_commas_inside_parentheses_belong_to_the_set():
    selector = parse_selector("a in (x, y, z), b")
    assert len(selector.expressions) == 2
    assert selector.expressions[0].values == ("x", "y", "z")
