"""`llmgw demo --scenario crac-failure`: the demo with a row's cooling failing, one command away."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

pytestmark = pytest.mark.django_db


def test_the_demo_replays_a_scenario_by_its_name_from_now():
    from facility.models import ScenarioRun

    out = StringIO()
    call_command("demo", "--no-serve", "--scenario", "crac-failure", stdout=out)
    assert out.getvalue().splitlines()[0] == (
        "Replaying crac-failure (crac-failure.yaml) at ×10 from now, 5.0 min: the Facility page and llmgw ctl "
        "facility events follow it"
    )
    run = ScenarioRun.objects.get()
    assert (run.name, run.speed) == ("crac-failure", 10.0)
    assert [t["domains"] for t in run.data["tracks"]][0] == ["rack:r1-01", "rack:r1-02"]


def test_an_unknown_scenario_or_speed_is_refused_before_anything_is_loaded():
    from agents.models import Node

    with pytest.raises(CommandError) as caught:
        call_command("demo", "--no-serve", "--scenario", "crac", stdout=StringIO())
    assert str(caught.value) == "--scenario: no scenario 'crac' (the demo's: crac-failure; or give a scenario file)"
    with pytest.raises(CommandError) as caught:
        call_command("demo", "--no-serve", "--scenario", "crac-failure", "--speed", "0", stdout=StringIO())
    assert str(caught.value) == "--speed: 0 is not above 0 and at most 10000"
    assert not Node.objects.exists()
