"""The embedded server's reconcile thread runs the work heartbeats ask of it before its round: asks of one
name before it runs are one run, and one that fails costs the others nothing."""

from __future__ import annotations

from llmgw import inprocess


def test_asks_of_one_name_are_one_run_and_a_failing_job_stops_no_other():
    ran: list[str] = []

    def boom() -> None:
        ran.append("boom")
        raise RuntimeError("broken")

    for _ in range(50):  # fifty nodes joining before the thread wakes
        inprocess.ask("feed-caps", lambda: ran.append("feed-caps"))
    inprocess.ask("broken", boom)
    inprocess.ask("other", lambda: ran.append("other"))
    inprocess._jobs_run()
    assert ran == ["feed-caps", "boom", "other"]
    inprocess._jobs_run()  # nothing left
    assert ran == ["feed-caps", "boom", "other"]
    inprocess._wake.clear()
