"""Capping: a warm domain's GPUs are asked for less in steps, restored after it has been ok a while; observe
mode only says so; placement counts the enforced limit, so capping frees room."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agents import readings
from agents.models import Node
from facility.services import budget_set, condition_override_clear, condition_override_set, facility_apply
from llmgw.ctl import main as ctl
from placement.capping import capping_blocks, capping_run
from placement.models import NodeCap
from placement.selectors import model_headroom
from placement.services import models_apply

pytestmark = pytest.mark.django_db

CAPPING = "  capping: {enabled: true, floor_fraction: 0.7}\n  sources: {agents: false}\n"


def apply(mode: str) -> None:
    facility_apply(text=f"facility:\n  conditions: {{mode: {mode}}}\n" + CAPPING)


def limits() -> dict[str, float]:
    return {name: block["all"]["power_limit_watts"] for name, block in capping_blocks().items()}


def test_a_warm_rack_is_capped_in_steps_to_the_floor_and_restored_after_ten_minutes(join_node):
    join_node("gpu01", rack="r1")
    join_node("gpu02", rack="r2")
    apply("enforce")
    condition_override_set(domain="rack:r1", condition="warm", reason="CRAC 2 down", seconds=7200)
    t0 = timezone.now()
    seen = []
    for minute in range(5):
        capping_run(now=t0 + timedelta(minutes=minute))
        seen.append(limits())
    assert seen == [{"gpu01": 630}, {"gpu01": 560}, {"gpu01": 490}, {"gpu01": 490}, {"gpu01": 490}]
    # The heartbeat answer carries it.
    readings.invalidate_assignments()
    readings.assignments("gpu01")
    assert readings.wanted_capping("gpu01") == {"lever": "power_limit", "all": {"power_limit_watts": 490}}
    assert readings.wanted_capping("gpu02") is None

    condition_override_clear(domain="rack:r1")
    condition_override_set(domain="rack:r1", condition="ok", reason="fixed", seconds=7200)
    capping_run(now=t0 + timedelta(minutes=6))
    capping_run(now=t0 + timedelta(minutes=15))
    assert limits() == {"gpu01": 490}  # ok for 9 minutes: still capped
    for minute in (16, 17, 18):
        capping_run(now=t0 + timedelta(minutes=minute))
    assert limits() == {}
    assert not NodeCap.objects.exists()


def test_observe_mode_sends_nothing_and_says_what_it_would_cap(join_node, capsys):
    join_node("gpu03", rack="r12-07")
    apply("observe")
    condition_override_set(domain="rack:r12-07", condition="warm", reason="CRAC 2 down", seconds=7200)
    for minute in range(3):
        capping_run(now=timezone.now() + timedelta(minutes=minute))
    assert capping_blocks() == {}
    assert ctl(["facility", "capping"]) == 0
    assert capsys.readouterr().out == "would cap gpu03 to 490 W (rack r12-07 warm)\n"


def test_with_capping_off_nothing_is_asked(join_node):
    join_node("gpu01", rack="r1")
    facility_apply(text="facility:\n  conditions: {mode: enforce}\n  sources: {agents: false}\n")
    condition_override_set(domain="rack:r1", condition="warm", reason="CRAC 2 down", seconds=7200)
    assert capping_run() == []
    assert capping_blocks() == {} and not NodeCap.objects.exists()


def test_a_capped_gpu_draws_its_enforced_limit_so_headroom_grows(join_node):
    join_node("gpu01", rack="r1")
    # 8 cards at 700 W + 350 W for the node: a 4.2 kW budget holds one 4-GPU replica (2.8 kW + 0.35).
    budget_set(domain="rack:r1", cap_watts=5000)
    facility_apply(text="facility:\n  margin: 0\n")
    models_apply(text="kind: Model\nname: m\nreplicas: 0\nprofile: {gpus: 4}\n")
    before = model_headroom("m")["fits"]
    node = Node.objects.get(name="gpu01")
    node.sensors = {"gpus": [{"index": i, "enforced_power_limit_watts": 490.0,
                              "default_power_limit_watts": 700.0} for i in range(8)]}
    node.save(update_fields=["sensors"])
    after = model_headroom("m")["fits"]
    assert (before, after) == (1, 2)


def test_the_locked_clocks_lever_asks_for_a_share_of_the_top_clock(join_node):
    join_node("gpu01", rack="r1")
    facility_apply(text="facility:\n  conditions: {mode: enforce}\n  capping: {enabled: true, lever: locked_clocks}\n")
    condition_override_set(domain="rack:r1", condition="hot", reason="CRAC 2 down", seconds=7200)
    capping_run()
    assert capping_blocks() == {"gpu01": {"lever": "locked_clocks", "all": {"locked_clocks_mhz": [210, 1782]}}}
