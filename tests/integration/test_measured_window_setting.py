"""server.yaml's facility.measured_window: validated, stored in FacilitySettings, read by the nodes layer's
measured peaks and shown in ctl facility's header."""

from __future__ import annotations

import pytest

from agents.models import measured_window_seconds
from facility.models import FacilitySettings
from facility.services import facility_apply
from llmgw.ctl import main as ctl
from llmgw.errors import InvalidInput

pytestmark = pytest.mark.django_db


def test_measured_window_from_server_yaml_is_used_and_shown(settings, join_node, capsys):
    settings.LLMGW_MEASURED_WINDOW_SECONDS = 900
    join_node("gpu01", rack="r1")
    assert measured_window_seconds() == 900
    facility_apply(text="facility:\n  measured_window: 5m\n")
    assert FacilitySettings.load().measured_window_seconds == 300
    assert measured_window_seconds() == 300
    assert ctl(["facility", "-o", "wide"]) == 0
    assert "MEASURED PEAK 5m" in capsys.readouterr().out
    # null: back to LLMGW_MEASURED_WINDOW_SECONDS; a file without the key changes nothing.
    facility_apply(text="facility:\n  measured_window: 20m\n")
    facility_apply(text="facility:\n  margin: 0.1\n")
    assert measured_window_seconds() == 1200
    facility_apply(text="facility:\n  measured_window: null\n")
    assert measured_window_seconds() == 900


@pytest.mark.parametrize(
    ("value", "message"),
    [("10s", "outside 1m to 24h"), ("25h", "outside 1m to 24h"), ("soon", "is not a duration"), ("true", "duration")],
)
def test_measured_window_refused_names_the_field(value, message):
    with pytest.raises(InvalidInput) as exc:
        facility_apply(text=f"facility:\n  measured_window: {value}\n")
    assert "facility.measured_window" in str(exc.value) and message in str(exc.value)
    assert FacilitySettings.load().measured_window_seconds is None
