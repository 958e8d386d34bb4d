"""A loaded plugin fails closed and costs only itself: a filter that raises (anything) or overruns its time
budget refuses the node in words naming it, a scorer scores 0, a NaN is an error, its words are cut, and
one that keeps failing is switched off for a cool-off, then tried again. Time is the test's clock."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from placement.plugins import (
    PLUGIN_COOL_OFF_SECONDS,
    PLUGIN_FAILURES_TO_SWITCH_OFF,
    PLUGIN_TEXT_CHARS,
    Filter,
    Registry,
    Scorer,
    external_keys,
    external_rejection,
    external_why,
)

NODE = SimpleNamespace(name="n1", labels={})
REQUEST = SimpleNamespace(model="m")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def registry(clock) -> Registry:
    return Registry(clock=clock)


def raising(exc: BaseException):
    def reject(node, request):
        raise exc

    return reject


@pytest.mark.parametrize(
    ("exc", "words"),
    [
        (ValueError("no such label"), "plugin affinity: raised ValueError: no such label"),
        (SystemExit(3), "plugin affinity: raised SystemExit: 3"),
        (KeyboardInterrupt(), "plugin affinity: raised KeyboardInterrupt"),
    ],
)
def test_a_filter_that_raises_refuses_the_node_in_words_naming_the_plugin(registry, exc, words):
    registry.add_filter(Filter("affinity", raising(exc)))
    assert external_rejection(registry, NODE, REQUEST) == words
    assert registry.failure_counts == {("affinity", "filter", "raised"): 1}


def test_a_scorer_that_raises_or_scores_nan_or_inf_scores_neutral_and_is_counted(registry, caplog):
    registry.add_scorer(Scorer("boom", raising(ZeroDivisionError("division by zero"))))
    registry.add_scorer(Scorer("nan", lambda node, request: float("nan")))
    registry.add_scorer(Scorer("inf", lambda node, request: float("-inf")))
    registry.add_scorer(Scorer("text", lambda node, request: "1"))
    registry.add_scorer(Scorer("fine", lambda node, request: 3))
    with caplog.at_level(logging.WARNING, logger="placement.plugins"):
        assert external_keys(registry, NODE, REQUEST) == {"boom": 0.0, "nan": 0.0, "inf": 0.0, "text": 0.0, "fine": 3.0}
    assert registry.failure_counts == {
        ("boom", "scorer", "raised"): 1, ("nan", "scorer", "invalid"): 1, ("inf", "scorer", "invalid"): 1,
        ("text", "scorer", "invalid"): 1,
    }
    assert "plugin nan: scored nan, not a finite number; it scores 0 (neutral)" in caplog.text
    assert "plugin inf: scored -inf, not a finite number" in caplog.text
    assert "plugin text: scored str, not a number" in caplog.text


def test_a_plugins_words_are_cut_to_a_bounded_length(registry):
    huge = "x" * 5_000_000
    registry.add_filter(Filter("chatty", lambda node, request: huge))
    reason = external_rejection(registry, NODE, REQUEST)
    assert reason == "chatty: " + "x" * (PLUGIN_TEXT_CHARS - 1) + "…"
    registry.remove_external()
    registry.add_filter(Filter("loud", raising(ValueError(huge))))
    reason = external_rejection(registry, NODE, REQUEST)
    assert len(reason) == len("plugin loud: raised ") + PLUGIN_TEXT_CHARS and reason.endswith("x…")
    registry.remove_external()
    registry.add_scorer(Scorer("chatty", lambda node, request: 0, lambda node, request: huge))
    assert external_why(registry, NODE, REQUEST) == ["x" * (PLUGIN_TEXT_CHARS - 1) + "… (chatty)"]


def test_a_filter_answering_other_than_words_refuses_the_node(registry):
    registry.add_filter(Filter("odd", lambda node, request: 42))
    assert external_rejection(registry, NODE, REQUEST) == "plugin odd: returned int, not the refusal's words or None"


def test_an_answer_later_than_the_time_budget_is_not_taken(registry, clock):
    def slow(node, request):
        clock.now += 0.25  # what the call took, on the registry's clock
        return None

    registry.add_filter(Filter("slow", slow))
    registry.add_scorer(Scorer("slow", lambda node, request: slow(node, request) or -5))
    assert external_rejection(registry, NODE, REQUEST) == "plugin slow: took 0.25 s, over its 0.05 s budget"
    assert external_keys(registry, NODE, REQUEST) == {"slow": 0.0}
    assert registry.failure_counts == {("slow", "filter", "overran"): 1, ("slow", "scorer", "overran"): 1}
    registry.call_seconds = 1.0
    assert external_rejection(registry, NODE, REQUEST) is None
    assert external_keys(registry, NODE, REQUEST) == {"slow": -5.0}


def test_a_plugin_that_keeps_failing_is_switched_off_for_a_cool_off_then_tried_again(registry, clock, caplog):
    calls: list[int] = []
    broken = [True]

    def flaky(node, request):
        calls.append(1)
        if broken[0]:
            raise ValueError("no such label")
        return None

    registry.add_filter(Filter("affinity", flaky))
    with caplog.at_level(logging.WARNING, logger="placement.plugins"):
        for _ in range(PLUGIN_FAILURES_TO_SWITCH_OFF):
            assert external_rejection(registry, NODE, REQUEST) == "plugin affinity: raised ValueError: no such label"
        off = (f"plugin affinity: switched off after {PLUGIN_FAILURES_TO_SWITCH_OFF} failures in a row "
               "(last: raised ValueError: no such label)")
        # Switched off: not called, and its filter refuses every node in those words.
        assert external_rejection(registry, NODE, REQUEST) == off
        assert len(calls) == PLUGIN_FAILURES_TO_SWITCH_OFF
        assert registry.switch_offs == {"affinity": 1}
        assert f"{off}; it is tried again in {PLUGIN_COOL_OFF_SECONDS:g} s" in caplog.text
        clock.now += PLUGIN_COOL_OFF_SECONDS - 1
        assert external_rejection(registry, NODE, REQUEST) == off
        clock.now += 1
        # Tried again after the cool-off: still failing, it is switched off again at once.
        assert external_rejection(registry, NODE, REQUEST) == "plugin affinity: raised ValueError: no such label"
        assert "plugin affinity: tried again after its cool-off" in caplog.text
        assert external_rejection(registry, NODE, REQUEST) == off
        assert registry.switch_offs == {"affinity": 2}
        clock.now += PLUGIN_COOL_OFF_SECONDS
        broken[0] = False
        assert external_rejection(registry, NODE, REQUEST) is None
        broken[0] = True  # mended, it has all its failures in a row to go again
        for _ in range(PLUGIN_FAILURES_TO_SWITCH_OFF - 1):
            external_rejection(registry, NODE, REQUEST)
        assert external_rejection(registry, NODE, REQUEST) == "plugin affinity: raised ValueError: no such label"
    # Logged once per plugin and error, however many nodes it failed on.
    assert caplog.text.count("plugin affinity: raised ValueError: no such label; the node is refused") == 1
