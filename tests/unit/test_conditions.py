"""Conditions: every transition, each hold time, both hysteresis edges, staleness, no flapping."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from facility.conditions import (
    COOLING_ALARM,
    HOT,
    INLET,
    OK,
    SLOWDOWN_MARGIN,
    THROTTLE_SHARE,
    UNKNOWN,
    WARM,
    DomainState,
    Reading,
    Thresholds,
    evaluate,
    worst,
)


def run(series, step=15.0, state=None, thresholds=None, extra=None):
    """Feed inlet values every ``step`` seconds, from where ``state`` was left; return the state and
    the transitions (the state carries on the clock in ``_clock``)."""
    state = state or DomainState()
    changes = []
    now = _clock.get(id(state), (None, 0.0))[1]
    for value in series:
        readings = {INLET: Reading(value, now)} if value is not None else {}
        readings.update(extra or {})
        for name, r in list(readings.items()):
            readings[name] = Reading(r.value, now, r.stale_after)
        state, change = evaluate(state, readings, now, thresholds or Thresholds())
        if change:
            changes.append(change)
        now += step
    _clock[id(state)] = (state, now)  # the state is kept so its id is not reused
    return state, changes


_clock: dict[int, tuple[DomainState, float]] = {}


def minutes(m, value, step=15.0):
    return [value] * int(m * 60 / step)


def test_no_reading_is_unknown():
    state, _ = evaluate(DomainState(), {}, 0.0)
    assert state.condition == UNKNOWN


def test_a_fresh_normal_reading_is_ok():
    state, (change,) = run([22.0])
    assert state.condition == OK and change.before == UNKNOWN and change.reason == "fresh readings"


def test_warm_needs_two_minutes_above_27():
    state, changes = run([22.0] + minutes(1.9, 28.0))
    assert state.condition == OK
    state, changes = run([22.0] + minutes(2.25, 28.0))
    assert state.condition == WARM
    assert changes[-1].reason == "inlet 28.0 °C for 2 min, warm above 27 °C"
    assert changes[-1].readings == {INLET: 28.0}


def test_hot_needs_two_minutes_above_32_and_says_so():
    state, changes = run([22.0] + minutes(1, 28.0) + minutes(2.25, 33.1))
    assert state.condition == HOT
    assert changes[-1].reason.startswith("inlet 33.1 °C for 2 min, hot above 32 °C")


def test_hot_leaves_only_after_five_minutes_under_31():
    hot, _ = run([22.0] + minutes(2.5, 33.0))
    assert hot.condition == HOT
    # 31.5 °C is under 32 but not under the band: stays hot however long.
    state, changes = run(minutes(20, 31.5), state=hot)
    assert state.condition == HOT and changes == []
    state, _ = run(minutes(4.5, 30.0), state=hot)
    assert state.condition == HOT
    state, changes = run(minutes(5.25, 30.0), state=hot)
    assert state.condition == WARM
    assert changes[-1].reason.startswith("inlet 30.0 °C under 31 °C for 5 min; inlet 30.0 °C for ")


def test_warm_leaves_only_after_five_minutes_under_26():
    warm, _ = run([22.0] + minutes(2.5, 28.0))
    state, _ = run(minutes(30, 26.5), state=warm)
    assert state.condition == WARM
    state, changes = run(minutes(5.25, 25.0), state=warm)
    assert state.condition == OK
    assert changes[-1].reason == "inlet 25.0 °C back to normal for 5 min"


def test_hot_straight_to_ok_when_already_cool_for_the_hold_time():
    hot, _ = run([22.0] + minutes(2.5, 33.0))
    state, changes = run(minutes(5.25, 22.0), state=hot)
    assert [c.after for c in changes] == [OK]


def test_cooling_alarm_is_hot_at_once():
    state, changes = run([22.0, 22.0], extra={COOLING_ALARM: Reading(1, 0)})
    assert state.condition == HOT and changes[-1].reason == "cooling alarm"


def test_quarter_of_gpus_throttling_for_two_minutes_is_hot():
    state, changes = run(minutes(1, 22.0), extra={THROTTLE_SHARE: Reading(0.25, 0)})
    assert state.condition == WARM  # any throttling is warm at once
    state, changes = run(minutes(2.25, 22.0), extra={THROTTLE_SHARE: Reading(0.25, 0)})
    assert state.condition == HOT
    assert "25% of GPUs throttling for heat for 2 min" in changes[-1].reason


def test_a_gpu_near_its_slowdown_temperature_is_warm():
    state, changes = run([22.0], extra={SLOWDOWN_MARGIN: Reading(4, 0)})
    assert state.condition == WARM
    assert changes[-1].reason == "a GPU 4 °C from its slowdown temperature"


def test_stale_readings_are_unknown_never_a_block():
    state, _ = run([22.0] + minutes(2.5, 33.0))
    assert state.condition == HOT
    # The probe stops: its last reading ages past stale_after.
    later, change = evaluate(state, {INLET: Reading(33.0, 150.0, stale_after=120)}, 150.0 + 121)
    assert later.condition == UNKNOWN and change.reason == "no fresh reading"


def test_worst_of_a_nodes_domains():
    assert worst([OK, WARM, UNKNOWN]) == WARM
    assert worst([UNKNOWN, OK]) == OK
    assert worst([UNKNOWN]) == UNKNOWN
    assert worst([]) == UNKNOWN
    assert worst([WARM, HOT]) == HOT


@settings(max_examples=40, deadline=None)
@given(
    threshold=st.sampled_from([27.0, 32.0]),
    seed=st.integers(0, 2**32 - 1),
    step=st.sampled_from([5.0, 15.0, 30.0]),
)
def test_noise_around_a_threshold_changes_condition_at_most_once_per_ten_minutes(threshold, seed, step):
    rng = random.Random(seed)
    series = [threshold + rng.uniform(-0.5, 0.5) for _ in range(int(3600 / step))]
    # Settled first: an hour well below the threshold's band, or (for 32 °C) an hour warm at 30 °C.
    settled, _ = run(minutes(60, threshold - 2.0), step=step)
    _, changes = run(series, step=step, state=settled)
    times = [c.at for c in changes]
    assert all(b - a >= 600 for a, b in zip(times, times[1:], strict=False)), changes
