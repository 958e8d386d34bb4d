"""placement.commit.collector_paused: the cyclic collector is off for a placement run and back as it was."""

from __future__ import annotations

import gc
import threading
from contextlib import contextmanager

import pytest

from placement.commit import collector_paused


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_the_collector_is_off_inside_and_on_again_after(collector_on):
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_nested_runs_turn_it_on_only_when_the_outer_one_ends(collector_on):
    with collector_paused():
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_failing_run_turns_it_on_again(collector_on):
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("a bug in the middle of a run")
    assert gc.isenabled()


def test_a_collector_turned_off_by_the_process_stays_off(collector_on):
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()


@contextmanager
def another_run_going():
    """A placement run in another thread, from entering this block until leaving it."""
    inside, leave = threading.Event(), threading.Event()

    def other():
        with collector_paused():
            inside.set()
            leave.wait(5)

    thread = threading.Thread(target=other)
    thread.start()
    inside.wait(5)
    try:
        yield
    finally:
        leave.set()
        thread.join(5)


def test_runs_in_two_threads_overlapping_leave_it_on_after_the_last(collector_on):
    with another_run_going():
        with collector_paused():
            pass
        assert not gc.isenabled()  # the other thread's run is still going
    assert gc.isenabled()


def test_runs_that_keep_overlapping_still_collect_now_and_then(collector_on, monkeypatch):
    import weakref

    import placement.commit.gc_pause as commit

    class Cyclic:
        pass

    monkeypatch.setattr(commit, "COLLECT_EVERY_SECONDS", 0.0)
    with another_run_going():
        with collector_paused():
            garbage = Cyclic()
            garbage.itself = garbage
            gone = weakref.ref(garbage)
            del garbage
            assert gone() is not None  # a cycle: reference counting alone cannot free it
        assert not gc.isenabled()  # the other run goes on
        assert gone() is None  # the run that ended collected it all the same
    assert gc.isenabled()
