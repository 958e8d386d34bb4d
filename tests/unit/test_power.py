"""Power accounting: draws, domain use and the refusal text people read."""

import pytest

from facility.domains import Domain
from facility.power import (
    Budget,
    DomainPower,
    FacilitySettings,
    NodePower,
    domain_power,
    domain_use_watts,
    node_use_added_watts,
    node_use_watts,
    power_refusal,
    shard_draw_watts,
    would_pass_limit,
)

RACK = Domain("rack", "r12-07")
SETTINGS = FacilitySettings()


def draw(**overrides):
    args = dict(
        gpus=8,
        cpu_cores=16,
        nodes=1,
        power_watts=None,
        node_gpu_power_limit_watts=None,
        settings=SETTINGS,
    )
    args.update(overrides)
    return shard_draw_watts(**args)


def test_settings_defaults_are_the_seeds():
    assert SETTINGS == FacilitySettings(margin=0.1, gpu_watts=700, cpu_core_watts=10, node_watts=350)


def test_limit_is_cap_less_margin():
    assert Budget(RACK, cap_watts=16000).limit_watts(0.1) == pytest.approx(14400)
    assert Budget(RACK, cap_watts=16000).limit_watts(0) == 16000


def test_declared_draw_is_split_over_the_replicas_nodes():
    assert draw(power_watts=6000, nodes=2, node_gpu_power_limit_watts=500) == 3000


def test_gpu_profile_takes_each_card_at_the_nodes_power_limit():
    assert draw(gpus=4, node_gpu_power_limit_watts=500) == 2000


def test_gpu_profile_falls_back_to_gpu_watts_and_ignores_cores():
    assert draw(gpus=4) == 2800


def test_cpu_profile_takes_each_reserved_core():
    assert draw(gpus=0, cpu_cores=16) == 160


def test_a_draw_nobody_knows_is_none():
    unknown = FacilitySettings(gpu_watts=None, cpu_core_watts=None)
    assert draw(settings=unknown) is None
    assert draw(gpus=0, settings=unknown) is None


def test_node_use_takes_the_larger_of_placed_and_fresh_measured():
    assert node_use_watts(2000, None, SETTINGS) == 2350
    assert node_use_watts(2000, 3000, SETTINGS) == 3350
    assert node_use_watts(2000, 1000, SETTINGS) == 2350
    assert node_use_watts(2000, None, FacilitySettings(node_watts=None)) == 2000


def test_domain_use_adds_other_watts_and_each_nodes_term():
    members = [NodePower(5600), NodePower(0, 1200), NodePower(1000, 400)]
    assert domain_use_watts(members, other_watts=800, settings=SETTINGS) == 800 + 3 * 350 + 5600 + 1200 + 1000


def test_domain_power_reports_reserved_measured_use_and_limit():
    report = domain_power(RACK, [NodePower(5600, 6000), NodePower(2800)], Budget(RACK, 16000, 800), SETTINGS)
    assert report == DomainPower(
        domain=RACK,
        nodes=2,
        reserved_watts=8400,
        measured_watts=6000,
        use_watts=800 + 700 + 6000 + 2800,
        cap_watts=16000,
        limit_watts=pytest.approx(14400),
        margin=0.1,
    )
    assert not report.is_over_limit


def test_domain_power_without_budget_or_readings():
    report = domain_power(RACK, [NodePower(100)], None, SETTINGS)
    assert report.measured_watts is None
    assert report.cap_watts is None and report.limit_watts is None
    assert report.use_watts == 450
    assert not report.is_over_limit


def test_domain_power_over_its_limit():
    report = domain_power(RACK, [NodePower(15000)], Budget(RACK, 16000), SETTINGS)
    assert report.is_over_limit


def test_landing_exactly_on_the_limit_fits():
    assert not would_pass_limit(14400, 14400)
    assert would_pass_limit(14401, 14400)
    assert would_pass_limit(14500, 14400)


def test_a_shard_adds_only_what_passes_the_nodes_measurement():
    # Idle node measuring 700 W, nothing placed: a 5.6 kW shard takes its term from 700 to 5600.
    assert node_use_added_watts(0, 700, 5600, SETTINGS) == 4900
    # Measured above placed + shard: the shard adds nothing the sensors do not already read.
    assert node_use_added_watts(1000, 9000, 2800, SETTINGS) == 0
    # No measurement (or one below what is placed): the whole draw.
    assert node_use_added_watts(2000, None, 2800, SETTINGS) == 2800
    assert node_use_added_watts(2000, 1500, 2800, SETTINGS) == 2800
    assert node_use_added_watts(2000, 700, None, SETTINGS) == 0


def test_refusal_text_is_exact():
    text = power_refusal(Budget(RACK, 16000), use_watts=14200, after_watts=16300, draw_watts=2800, margin=0.1)
    assert text == (
        "rack r12-07: 14.2 kW of a 14.4 kW limit (16.0 kW cap less 10%) in use, 16.3 kW with the shard (~2.8 kW)"
    )


def test_refusal_text_for_a_replicas_shards_together():
    text = power_refusal(
        Budget(RACK, 16000), use_watts=9000, after_watts=14600, draw_watts=5600, margin=0.1, combined=True
    )
    assert text == (
        "rack r12-07: 9.0 kW of a 14.4 kW limit (16.0 kW cap less 10%) in use, "
        "14.6 kW with the replica's shards here (~5.6 kW)"
    )


def test_refusal_text_with_a_fractional_margin_and_a_pdu():
    pdu = Domain("pdu", "r12-07-a")
    text = power_refusal(Budget(pdu, 7400), use_watts=6000, after_watts=6700, draw_watts=700, margin=0.125)
    assert text == (
        "pdu r12-07-a: 6.0 kW of a 6.5 kW limit (7.4 kW cap less 12.5%) in use, 6.7 kW with the shard (~0.7 kW)"
    )


def test_refusal_of_an_unknown_draw_in_a_domain_already_past_its_limit():
    text = power_refusal(Budget(RACK, 16000), use_watts=15000, after_watts=15000, draw_watts=None, margin=0.1)
    assert text == "rack r12-07: 15.0 kW of a 14.4 kW limit (16.0 kW cap less 10%) in use, already past it"


def test_the_near_limit_alert_fires_on_the_share_the_console_calls_near():
    import re
    from pathlib import Path

    import yaml

    from facility.power import NEAR_LIMIT_SHARE

    rules = yaml.safe_load((Path(__file__).parents[2] / "deploy/prometheus/alerts.yaml").read_text())
    near = next(r for g in rules["groups"] for r in g["rules"] if r["alert"] == "LlmgwDomainNearPowerLimit")
    share = float(re.search(r">\s*([0-9.]+)\s*$", near["expr"]).group(1))
    assert share == NEAR_LIMIT_SHARE


def test_the_measured_peak_is_the_second_highest_reading_of_the_window():
    from facility.power import measured_peak

    buckets, peak = measured_peak([], 650.0, 1000.0, 900.0)
    assert peak is None  # one sample holds no peak
    buckets, peak = measured_peak(buckets, 120.0, 1030.0, 900.0)
    assert peak == 120.0
    buckets, peak = measured_peak(buckets, 640.0, 1050.0, 900.0)  # a second burst: the peak is held
    assert peak == 640.0
    buckets, peak = measured_peak(buckets, 90.0, 1070.0, 900.0)  # a dip does not lower it
    assert peak == 640.0
    buckets, peak = measured_peak(buckets, None, 1500.0, 900.0)  # no reading: the window's still counts
    assert peak == 640.0
    buckets, peak = measured_peak(buckets, 200.0, 1000.0 + 900.0 + 120.0, 900.0)  # the bursts left the window
    assert peak is None
    buckets, peak = measured_peak(buckets, 210.0, 1000.0 + 900.0 + 130.0, 900.0)
    assert peak == 200.0
    assert measured_peak([], None, 0.0, 900.0) == ([], None)


def test_one_spike_among_steady_readings_never_holds_the_peak():
    from facility.power import measured_peak

    buckets: list = []
    for i in range(90):  # 15 minutes of 10-s readings, one of them a glitch of 11 kW
        buckets, peak = measured_peak(buckets, 11_000.0 if i == 45 else 2_400.0, 1000.0 + 10 * i, 900.0)
    assert peak == 2_400.0
    # Two bursts in one bucket hold it: a bucket keeps its two highest readings.
    buckets, peak = measured_peak(buckets, 5_000.0, 1000.0 + 10 * 90, 900.0)
    assert peak == 5_000.0
    assert buckets[-1][1:] == [5_000.0, 2_400.0]


def test_buckets_of_an_older_store_count_as_one_reading_each():
    from facility.power import measured_peak

    assert measured_peak([[960.0, 650.0]], None, 1000.0, 900.0) == ([[960.0, 650.0]], None)
    assert measured_peak([[900.0, 650.0], [960.0, 300.0]], None, 1000.0, 900.0)[1] == 300.0
