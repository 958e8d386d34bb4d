"""Capping: a warm domain's GPUs are asked for less in steps, restored after it has been ok a while; observe
mode only says so; placement counts the enforced limit, so capping frees room."""

from __future__ import annotations

import json
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
from placement.snapshot import node_views

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


@pytest.mark.parametrize(
    "sensors",
    [
        {},
        {"gpus": "eight"},
        {"gpus": {"index": 0, "enforced_power_limit_watts": 490.0}},
        {"gpus": [7, None, "x", [0, 490.0]]},
        {"gpus": [{"enforced_power_limit_watts": 490.0}, {"index": 1}, {"index": 2, "enforced_power_limit_watts": None}]},
        {"gpus": [{"index": 0, "enforced_power_limit_watts": "490 W"}, {"index": "1", "enforced_power_limit_watts": 490.0},
                  {"index": 2, "enforced_power_limit_watts": True}]},
    ],
    ids=["empty", "text", "object", "not-objects", "half-reported", "not-figures"],
)
def test_sensors_without_a_whole_enforced_limit_leave_the_inventory_limit(join_node, sensors):
    # The database picks the cards' enforced limits out of the sensors document (placement.snapshot):
    # whatever its shape, a card without both its index and its limit counts its inventory limit.
    join_node("gpu01", rack="r1")
    node = Node.objects.get(name="gpu01")
    node.sensors = sensors
    node.save(update_fields=["sensors"])
    (view,) = node_views(names=["gpu01"])
    assert view.gpu_power_limit_watts == 700
    node.sensors = {"gpus": [{"index": 3, "enforced_power_limit_watts": 490.0}]}
    node.save(update_fields=["sensors"])
    assert node_views(names=["gpu01"])[0].gpu_power_limit_watts == 700  # the highest card's limit: 700 W
    node.sensors = {"gpus": [{"index": i, "enforced_power_limit_watts": 490.0} for i in range(8)]}
    node.save(update_fields=["sensors"])
    assert node_views(names=["gpu01"])[0].gpu_power_limit_watts == 490


def test_the_locked_clocks_lever_asks_for_a_share_of_the_top_clock(join_node):
    join_node("gpu01", rack="r1")
    facility_apply(text="facility:\n  conditions: {mode: enforce}\n  capping: {enabled: true, lever: locked_clocks}\n")
    condition_override_set(domain="rack:r1", condition="hot", reason="CRAC 2 down", seconds=7200)
    capping_run()
    assert capping_blocks() == {"gpu01": {"lever": "locked_clocks", "all": {"locked_clocks_mhz": [210, 1782]}}}


def report_top_clocks(name: str, tops: list[int | None]) -> None:
    """What the node's agent last reported: each GPU's top SM clock (None: not reported)."""
    node = Node.objects.get(name=name)
    gpus = []
    for index, top in enumerate(tops):
        gpu = {"index": index, "uuid": f"GPU-{name}-{index}", "default_power_limit_watts": 400.0}
        if top is not None:
            gpu["max_sm_clock_mhz"] = top
        gpus.append(gpu)
    node.sensors = {"gpus": gpus}
    node.save(update_fields=["sensors"])


def cap_with_locked_clocks(mode: str = "enforce", steps: int = 2) -> None:
    """rack:r1 hot under the locked-clocks lever, `steps` evaluations (0.8 of the top after two)."""
    facility_apply(text=f"facility:\n  conditions: {{mode: {mode}}}\n"
                        "  capping: {enabled: true, lever: locked_clocks, floor_fraction: 0.5}\n  sources: {agents: false}\n")
    condition_override_set(domain="rack:r1", condition="hot", reason="CRAC 2 down", seconds=7200)
    t0 = timezone.now()
    for minute in range(steps):
        capping_run(now=t0 + timedelta(minutes=minute))


@pytest.mark.parametrize(
    ("tops", "wanted", "text"),
    [
        # A100 SXM: 80 % of its own 1410 MHz, not 80 % of a Hopper's 1980 (which it could not reach anyway).
        ([1410] * 8, {"all": {"locked_clocks_mhz": [210, 1128]}}, "gpu01 capped to 1128 MHz (rack r1 hot)\n"),
        # L40S: 80 % of 2520 MHz, not 1584 MHz (63 % of its top).
        ([2520] * 8, {"all": {"locked_clocks_mhz": [210, 2016]}}, "gpu01 capped to 2016 MHz (rack r1 hot)\n"),
        # An agent too old to report the top: a Hopper SXM's is assumed, and the row says so.
        ([None] * 8, {"all": {"locked_clocks_mhz": [210, 1584]}},
         "gpu01 capped to 1584 MHz (rack r1 hot); no top SM clock reported: 1980 MHz assumed\n"),
        # Cards that differ on one node: each by its uuid, at the share of its own top.
        ([1410, 1410, 2520, 2520],
         {"gpus": [{"uuid": f"GPU-gpu01-{i}", "locked_clocks_mhz": [210, mhz]}
                   for i, mhz in enumerate([1128, 1128, 2016, 2016])]},
         "gpu01 capped to 1128 MHz on GPUs 0-1, 2016 MHz on GPUs 2-3 (rack r1 hot)\n"),
        # One card that does not say: `all` covers it at the assumed top.
        ([1410, 1410, 1410, None],
         {"all": {"locked_clocks_mhz": [210, 1584]},
          "gpus": [{"uuid": f"GPU-gpu01-{i}", "locked_clocks_mhz": [210, 1128]} for i in range(3)]},
         "gpu01 capped to 1128 MHz on GPUs 0-2, 1584 MHz on GPU 3 (rack r1 hot); "
         "no top SM clock reported for GPU 3: 1980 MHz assumed\n"),
    ],
    ids=["a100", "l40s", "no-top-reported", "mixed", "one-unknown"],
)
def test_locked_clocks_cap_each_card_by_its_own_top_clock(join_node, capsys, tops, wanted, text):
    join_node("gpu01", rack="r1")
    report_top_clocks("gpu01", tops)
    cap_with_locked_clocks()
    assert capping_blocks() == {"gpu01": {"lever": "locked_clocks", **wanted}}
    readings.invalidate_assignments()
    readings.assignments("gpu01")
    assert readings.wanted_capping("gpu01") == {"lever": "locked_clocks", **wanted}
    assert ctl(["facility", "capping"]) == 0
    assert capsys.readouterr().out.replace(";\n  ", "; ") == text  # a long line breaks after its "; "


def test_observe_mode_says_what_clock_each_card_would_be_locked_to(join_node, capsys):
    join_node("gpu01", rack="r1")
    join_node("gpu02", rack="r1")
    report_top_clocks("gpu01", [1410] * 8)
    cap_with_locked_clocks(mode="observe", steps=3)
    assert capping_blocks() == {}
    assert ctl(["facility", "capping"]) == 0
    assert capsys.readouterr().out == (
        "would cap gpu01 to 987 MHz (rack r1 hot)\n"
        "would cap gpu02 to 1386 MHz (rack r1 hot); no top SM clock reported: 1980 MHz assumed\n"
    )
    assert ctl(["facility", "capping", "-o", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["nodes"]
    assert [row["locked_clocks"] for row in rows] == [
        [{"gpus": list(range(8)), "max_sm_clock_mhz": 1410, "top_reported": True, "locked_clocks_mhz": [210, 987]}],
        [{"gpus": [], "max_sm_clock_mhz": 1980, "top_reported": False, "locked_clocks_mhz": [210, 1386]}],
    ]


def test_the_lowest_lock_stays_210_mhz(join_node):
    join_node("gpu01", rack="r1")
    report_top_clocks("gpu01", [210] * 8)
    cap_with_locked_clocks()
    assert capping_blocks() == {"gpu01": {"lever": "locked_clocks", "all": {"locked_clocks_mhz": [210, 210]}}}
