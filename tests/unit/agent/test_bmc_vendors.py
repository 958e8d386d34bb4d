"""The node's draw from BMCs of several makers, each a real recorded answer (tests/fixtures/redfish/README.md
names its source) served by sushy-static: the figure the agent reads, and where there is none, why."""

from __future__ import annotations

import pytest

from agents.node.sensors.bmc import BmcDown
from tests.fakes.redfish import sushy_static
from tests.unit.agent.test_bmc import read


@pytest.mark.parametrize(
    ("mockup", "chassis", "taken"),
    [
        # HPE iLO 5, ProLiant DL325 Gen10 Plus: one chassis, PowerControl's 97 W.
        ("hpe-dl325", None, (97.0, "Power")),
        # HPE Apollo XL675d with 8 A100s (iLO 5): chassis "1" (RackMount) links the system, beside the
        # enclosure it sits in; iLO writes every link with a trailing slash.
        ("hpe-xl675d-a100", None, (894.0, "Power")),
        ("hpe-xl675d-a100", "1", (894.0, "Power")),
        # Gigabyte H262-Z63 (an AMI BMC): chassis "Self", PowerControl's 100 W.
        ("gigabyte-h262", None, (100.0, "Power")),
    ],
)
def test_the_chassis_power_of_each_makers_bmc(mockup, chassis, taken):
    with sushy_static(mockup) as url:
        assert read(url, chassis=chassis) == taken


def test_the_apollo_enclosure_is_not_taken_for_the_node():
    # Named, the enclosure is read, and it has no power resource: said so, not 0 W.
    with sushy_static("hpe-xl675d-a100") as url, pytest.raises(BmcDown) as down:
        read(url, chassis="EnclosureChassis")
    assert str(down.value) == (
        "chassis EnclosureChassis reports no power reading (no EnvironmentMetrics, PowerSubsystem, Power or Sensors)"
    )


def test_stock_openbmc_without_power_sensors_says_what_it_read():
    # Its PowerControl has no PowerConsumedWatts and its Sensors collection is empty.
    with sushy_static("openbmc-stock") as url, pytest.raises(BmcDown) as down:
        read(url)
    assert str(down.value) == "chassis chassis reports no power reading (Power, Sensors read)"


def test_a_dell_idrac_rack_chassis_is_taken_and_its_missing_power_said():
    # Dell's iDRAC calls the server's own chassis "Rack"; this recorded answer links Thermal only.
    with sushy_static("dell-idrac-rack") as url, pytest.raises(BmcDown) as down:
        read(url)
    assert str(down.value) == (
        "chassis System.Embedded.1 reports no power reading (no EnvironmentMetrics, PowerSubsystem, Power or Sensors)"
    )


def test_a_blade_enclosures_bmc_asks_which_blade_and_a_blade_without_power_says_so():
    # DMTF's bladed mockup: an enclosure and four blades, each blade linking its own system.
    with sushy_static("public-bladed") as url:
        with pytest.raises(BmcDown) as several:
            read(url)
        with pytest.raises(BmcDown) as blade:
            read(url, chassis="Blade1")
    assert str(several.value) == (
        "the BMC has 5 chassis (MultiBladeEncl, Blade1, Blade2, Blade3, Blade4); name the node's in agent.yaml "
        "(bmc: chassis:)"
    )
    assert str(blade.value) == (
        "chassis Blade1 reports no power reading (no EnvironmentMetrics, PowerSubsystem, Power or Sensors)"
    )


def test_a_rack_server_with_trays_linking_the_same_system_is_read_once_named():
    # DMTF's telemetry mockup: chassis 1 and three trays, every one a RackMount linking system 1.
    with sushy_static("public-telemetry") as url:
        with pytest.raises(BmcDown) as several:
            read(url)
        assert read(url, chassis="1") == (8000.0, "Power")
    assert str(several.value) == (
        "the BMC has 4 chassis (1, Tray_1, Tray_2, Tray_3); name the node's in agent.yaml (bmc: chassis:)"
    )
