"""Thermal conditions end to end: server.yaml, the simulated source on a fake clock, placement in both modes."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from django.utils import timezone

from facility.evaluation import conditions_evaluate, effective_conditions
from facility.models import ConditionEvent, DomainCondition, FacilitySettings
from facility.services import condition_override_clear, condition_override_set, facility_apply, scenario_start
from llmgw.ctl import main as ctl
from llmgw.errors import InvalidInput
from placement import selectors, services

pytestmark = pytest.mark.django_db(transaction=True)

CRAC = Path(__file__).resolve().parents[2] / "llmgw" / "demo" / "scenarios" / "crac-failure.yaml"
STEP = timedelta(seconds=30)


def run(capsys, *argv: str) -> tuple[int, str]:
    code = ctl(list(argv))
    out, _ = capsys.readouterr()
    return code, out


def replay(minutes: float, *, start=None) -> timezone.datetime:
    """Start crac-failure ``minutes`` ago and evaluate every 30 s of it up to now: a fake clock, no sleeps."""
    now = timezone.now()
    start = start or now - timedelta(minutes=minutes)
    scenario_start(data=yaml.safe_load(CRAC.read_text()), started_at=start)
    moment = start
    while moment <= now:
        conditions_evaluate(now=moment)
        moment += STEP
    return start


def evaluate_until(start, minutes: float) -> None:
    """Go on evaluating from where replay stopped until ``minutes`` into the scenario."""
    last = DomainCondition.objects.order_by("-evaluated_at").values_list("evaluated_at", flat=True).first()
    moment = last + STEP
    while moment <= start + timedelta(minutes=minutes):
        conditions_evaluate(now=moment)
        moment += STEP


def apply_mode(mode: str) -> None:
    facility_apply(text=f"facility:\n  conditions:\n    mode: {mode}\n  sources:\n    agents: false\n")


def condition(domain: str) -> str:
    return DomainCondition.objects.get(domain=domain).condition


def test_the_scenario_walks_a_rack_through_warm_and_hot_and_back(join_node):
    join_node("gpu01", rack="r1-01")
    apply_mode("observe")
    start = replay(8)
    assert condition("rack:r1-01") == "warm"
    assert condition("rack:r2-01") == "ok"
    evaluate_until(start, 13)
    assert condition("rack:r1-01") == "hot"
    evaluate_until(start, 34)
    assert condition("rack:r1-01") == "warm"
    evaluate_until(start, 40)
    assert condition("rack:r1-01") == "ok"
    steps = [(e.before, e.after) for e in ConditionEvent.objects.filter(domain="rack:r1-01").order_by("at", "id")]
    assert steps == [("unknown", "ok"), ("ok", "warm"), ("warm", "hot"), ("hot", "warm"), ("warm", "ok")]
    hot = ConditionEvent.objects.get(domain="rack:r1-01", after="hot")
    assert hot.reason.startswith("inlet 3") and "hot above 32 °C" in hot.reason
    assert hot.readings["inlet_temp_c"] > 32


def test_observe_mode_places_as_before_and_says_what_it_would_have_refused(capsys, join_node):
    join_node("gpu01", rack="r1-01")
    join_node("gpu02", rack="r2-01")
    apply_mode("observe")
    replay(15)
    assert condition("rack:r1-01") == "hot"
    services.model_apply(data={"kind": "Model", "name": "m", "replicas": 1, "profile": {"gpus": 8}})
    assert [r["nodes"] for r in selectors.replica_rows(model="m")] == [["gpu01"]]
    code, out = run(capsys, "explain-placement", "m")
    assert code == 0
    assert "  would have refused: rack r1-01 is hot (inlet 35.0 °C for " in out
    assert "hot above 32 °C)" in out


def test_enforce_mode_places_nothing_in_the_hot_row_and_places_there_after_recovery(capsys, join_node):
    join_node("gpu01", rack="r1-01")
    join_node("gpu02", rack="r2-01")
    apply_mode("enforce")
    start = replay(15)
    services.model_apply(data={"kind": "Model", "name": "m", "replicas": 2, "profile": {"gpus": 8}})
    rows = selectors.replica_rows(model="m")
    assert [r["nodes"] for r in rows if r["nodes"]] == [["gpu02"]]
    pending = [r for r in rows if r["state"] == "pending"]
    assert len(pending) == 1
    code, out = run(capsys, "explain-placement", "m")
    assert "gpu01: rack r1-01 is hot (inlet 35.0 °C for " in out
    evaluate_until(start, 40)
    assert condition("rack:r1-01") == "ok"
    assert sorted(n for r in selectors.replica_rows(model="m") for n in r["nodes"]) == ["gpu01", "gpu02"]


def test_an_override_wins_until_cleared(join_node):
    join_node("gpu01", rack="r1-01")
    apply_mode("enforce")
    replay(15)
    condition_override_set(domain="rack:r1-01", condition="ok", reason="probe fault", seconds=7200)
    assert effective_conditions()["rack:r1-01"]["condition"] == "ok"
    services.model_apply(data={"kind": "Model", "name": "m", "replicas": 1, "profile": {"gpus": 8}})
    assert [r["nodes"] for r in selectors.replica_rows(model="m")] == [["gpu01"]]
    condition_override_clear(domain="rack:r1-01")
    assert effective_conditions()["rack:r1-01"]["condition"] == "hot"
    reasons = list(ConditionEvent.objects.filter(domain="rack:r1-01").values_list("reason", flat=True))
    assert "set by hand: probe fault" in reasons and "cleared by hand" in reasons


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ("  conditions:\n    mode: strict\n",
         "server.yaml line 3: facility.conditions.mode: one of observe, enforce, not 'strict'"),
        ("  conditions:\n    thresholds:\n      hot_inlet_c: 20\n",
         "server.yaml line 4: facility.conditions.thresholds.hot_inlet_c: at least warm_inlet_c"),
        ("  conditions:\n    domains:\n      rack:r1:\n        thresholds: {band_c: -1}\n",
         "server.yaml line 5: facility.conditions.domains.rack:r1.thresholds.band_c: between 0 and 50, got -1"),
        ("  sources:\n    prometheus:\n      url: monitoring:9090\n      signals: {}\n",
         "server.yaml line 4: facility.sources.prometheus.url: an http(s) URL, e.g. http://monitoring:9090"),
        ("  sources:\n    prometheus:\n      url: http://m:9090\n      signals:\n        inlet_temp_c:\n"
         "          query: up\n          domain_label: aisle\n",
         "server.yaml line 8: facility.sources.prometheus.signals.inlet_temp_c.domain_label: "
         "one of site, room, row, rack, pdu"),
        ("  sources:\n    simulated: {file: /nonexistent/scenario.yaml}\n",
         "server.yaml line 3: facility.sources.simulated.file: /nonexistent/scenario.yaml: "),
    ],
)
def test_a_wrong_block_names_file_line_and_path_and_applies_nothing(block, message):
    with pytest.raises(InvalidInput) as caught:
        facility_apply(text="facility:\n" + block + "  margin: 0.2\n")
    assert str(caught.value).startswith(message), str(caught.value)
    assert FacilitySettings.load().margin == 0.1
    assert FacilitySettings.load().conditions == {}


def test_ctl_shows_conditions_events_and_sets_an_override(capsys, join_node):
    join_node("gpu01", rack="r1-01", labels={"llmgw.io/row": "1"})
    apply_mode("enforce")
    replay(15)
    code, out = run(capsys, "facility", "-o", "wide")  # every reading of a condition: the wide table
    row = next(line for line in out.splitlines() if line.startswith("rack:r1-01"))
    assert "hot (inlet 35.0 °C, " in row and " s old)" in row
    # Row 1 at its hot rack's condition, its own beside it, as the console's facility page says it.
    row = next(line for line in out.splitlines() if line.startswith("row:1 "))
    assert " hot from rack r1-01; its own: unknown " in row  # the scenario reads racks only
    code, out = run(capsys, "facility", "-o", "json")
    rows = {d["domain"]: d for d in json.loads(out)["domains"]}
    assert rows["row:1"]["rolled_up"] == {"condition": "hot", "from": "rack r1-01"} and rows["rack:r1-01"]["rolled_up"] is None
    code, out = run(capsys, "nodes")
    assert out.splitlines()[1].split()[3] == "hot"
    code, out = run(capsys, "facility", "events", "--domain", "rack:r1-01")
    assert [line.split()[4] for line in out.splitlines()[1:]] == ["hot", "warm", "ok"]
    code, out = run(capsys, "facility", "events", "-o", "json")
    assert {e["to"] for e in json.loads(out)} >= {"ok", "warm", "hot"}
    code, out = run(capsys, "facility", "condition", "set", "rack:r1-01", "ok", "--reason", "probe fault", "--for", "2h")
    assert code == 0 and out.startswith("rack:r1-01 set ok until ")
    code, out = run(capsys, "facility")
    row = next(line for line in out.splitlines() if line.startswith("rack:r1-01"))
    assert "ok (set by hand, inlet 35.0 °C" in row
    code, out = run(capsys, "facility", "condition", "clear", "rack:r1-01")
    assert out == "rack:r1-01: condition set by hand cleared\n"
    # Plain seconds, as --help says: `--for 120` is two minutes.
    from facility.models import ConditionOverride

    code, out = run(capsys, "facility", "condition", "set", "rack:r1-01", "ok", "--reason", "probe fault", "--for", "120")
    override = ConditionOverride.objects.get(domain="rack:r1-01")
    assert code == 0 and round((override.until - override.created_at).total_seconds()) == 120


def test_sim_facility_starts_the_replay_the_evaluation_reads(capsys, join_node):
    from django.core.management import call_command

    from facility.models import ScenarioRun

    call_command("sim", "facility", "-f", str(CRAC), "--speed", "2")
    assert "replaying crac-failure at ×2 from now (25.0 min)" in capsys.readouterr().out
    run_ = ScenarioRun.objects.get()
    assert run_.speed == 2
    apply_mode("enforce")
    # 8 minutes at ×2 are 16 of the scenario's: above 32 °C since 5 minutes of the scenario's clock.
    moment = run_.started_at
    while moment <= run_.started_at + timedelta(minutes=8):
        conditions_evaluate(now=moment)
        moment += timedelta(seconds=6)
    assert condition("rack:r1-01") == "hot"


@pytest.mark.parametrize("speed", [10, 30])
def test_a_fast_replay_shrinks_the_hold_times_too(speed, join_node):
    """The scenario's clock, not the wall's: at ×10 and ×30 the row still turns warm, hot, then back to ok,
    with the same steps as at ×1 (the hold times shrink with the readings)."""
    join_node("gpu01", rack="r1-01")
    apply_mode("enforce")
    start = timezone.now() - timedelta(hours=1)
    scenario_start(data=yaml.safe_load(CRAC.read_text()), speed=speed, started_at=start)
    moment = start
    seen = []
    # Evaluated every 2 s of wall time through the scenario's 50 minutes.
    while moment <= start + timedelta(minutes=50 / speed):
        conditions_evaluate(now=moment)
        moment += timedelta(seconds=2)
        if not seen or seen[-1] != condition("rack:r1-01"):
            seen.append(condition("rack:r1-01"))
    assert seen == ["ok", "warm", "hot", "warm", "ok"]
    assert condition("rack:r2-01") == "ok"


def test_the_api_shows_conditions_and_events_and_sets_overrides(api, viewer_api, join_node):
    join_node("gpu01", rack="r1-01")
    apply_mode("enforce")
    replay(15)
    facility = api.get("/api/v1/facility").json()
    row = next(d for d in facility["domains"] if d["domain"] == "rack:r1-01")
    assert row["condition"]["condition"] == "hot" and row["condition"]["mode"] == "enforce"
    assert row["condition"]["readings"]["inlet_temp_c"] == 35.0
    assert {s["name"]: s["up"] for s in facility["sources"]} == {"simulated": True}
    events = api.get("/api/v1/facility/events", {"domain": "rack:r1-01"}).json()
    assert [(e["from"], e["to"]) for e in events] == [("warm", "hot"), ("ok", "warm"), ("unknown", "ok")]
    assert api.get("/api/v1/facility/events", {"limit": "0"}).json()["field"] == "limit"
    for digits in ("²", "١٢", "𝟗"):  # digits to str.isdigit, no number to int()
        refused = api.get("/api/v1/facility/events", {"limit": digits})
        assert (refused.status_code, refused.json()["field"]) == (400, "limit")
    body = {"domain": "rack:r1-01", "condition": "ok", "reason": "probe fault", "for_seconds": 7200}
    for no_number in (True, "7200"):  # not one second, nor a text the client meant as a number
        refused = api.post("/api/v1/facility/conditions", {**body, "for_seconds": no_number}, format="json")
        assert (refused.status_code, refused.json()["field"]) == (400, "for_seconds")
    assert viewer_api.post("/api/v1/facility/conditions", body, format="json").status_code == 403
    response = api.post("/api/v1/facility/conditions", body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["condition"] == "ok" and response.json()["until"]
    row = next(d for d in api.get("/api/v1/facility").json()["domains"] if d["domain"] == "rack:r1-01")
    assert (row["condition"]["condition"], row["condition"]["overridden"]) == ("ok", True)
    assert api.delete("/api/v1/facility/conditions/rack:r1-01").status_code == 204
    assert api.delete("/api/v1/facility/conditions/rack:r1-01").status_code == 404
